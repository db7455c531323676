package io.rota.spring.cloud;

import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.web.reactive.function.client.WebClient;

/**
 * Installs {@link RotaVersionExchangeFilter} first in every {@code WebClient.Builder} bean,
 * load-balanced or not, so that the version of the call chain reaches every downstream service.
 */
public class RotaVersionWebClientPostProcessor implements BeanPostProcessor {
    private final RotaVersionExchangeFilter filter;

    public RotaVersionWebClientPostProcessor(RotaVersionExchangeFilter filter) {
        this.filter = filter;
    }

    @Override
    public Object postProcessBeforeInitialization(Object bean, String beanName) {
        if (bean instanceof WebClient.Builder builder) {
            builder.filters(filters -> RotaVersionExchangeFilter.installFirst(filters, filter));
        }
        return bean;
    }
}
