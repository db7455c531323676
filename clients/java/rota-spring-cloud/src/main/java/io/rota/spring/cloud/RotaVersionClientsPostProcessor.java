package io.rota.spring.cloud;

import java.util.ArrayList;
import java.util.List;

import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.http.client.ClientHttpRequestInterceptor;
import org.springframework.web.client.RestClient;
import org.springframework.web.client.RestTemplate;

/**
 * Installs {@link RotaVersionRequestInterceptor} first in every {@code RestTemplate} and
 * {@code RestClient.Builder} bean, load-balanced or not, so that the version of the call chain
 * reaches every downstream service.
 */
public class RotaVersionClientsPostProcessor implements BeanPostProcessor {
    private final RotaVersionRequestInterceptor interceptor;

    public RotaVersionClientsPostProcessor(RotaVersionRequestInterceptor interceptor) {
        this.interceptor = interceptor;
    }

    @Override
    public Object postProcessBeforeInitialization(Object bean, String beanName) {
        if (bean instanceof RestTemplate template) {
            List<ClientHttpRequestInterceptor> interceptors = new ArrayList<>(template.getInterceptors());
            RotaVersionRequestInterceptor.installFirst(interceptors, interceptor);
            template.setInterceptors(interceptors);
        } else if (bean instanceof RestClient.Builder builder) {
            builder.requestInterceptors(interceptors -> RotaVersionRequestInterceptor.installFirst(interceptors, interceptor));
        }
        return bean;
    }
}
