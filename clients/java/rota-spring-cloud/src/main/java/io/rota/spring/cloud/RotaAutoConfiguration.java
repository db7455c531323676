package io.rota.spring.cloud;

import java.util.ArrayList;
import java.util.List;

import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.cloud.commons.util.InetUtils;
import org.springframework.context.ApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.core.Ordered;
import org.springframework.http.client.ClientHttpRequestInterceptor;
import org.springframework.web.client.RestTemplate;
import org.springframework.web.filter.OncePerRequestFilter;
import org.springframework.web.reactive.function.client.WebClient;
import org.springframework.web.server.WebFilter;

import io.rota.client.RotaClient;

/**
 * The {@link RotaClient} bean, self-registration ({@code rota.registration.enabled=true}) and
 * propagation of {@code X-Rota-Version}: incoming requests set the current version (servlet filter
 * or WebFlux filter), outgoing {@code RestTemplate}, {@code RestClient} and {@code WebClient}
 * calls forward it.
 */
@AutoConfiguration
@ConditionalOnProperty(prefix = "rota", name = "enabled", matchIfMissing = true)
@EnableConfigurationProperties(RotaProperties.class)
public class RotaAutoConfiguration {

    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public RotaClient rotaClient(RotaProperties properties) {
        return RotaClient.builder()
                .target(properties.getTarget())
                .credentials(properties.credentials())
                .pickTimeout(properties.getPickTimeout())
                .build();
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnProperty(prefix = "rota.registration", name = "enabled", havingValue = "true")
    static class RegistrationConfiguration {

        @Bean
        @ConditionalOnMissingBean
        RotaAutoRegistration rotaAutoRegistration(RotaClient client, RotaProperties properties,
                ApplicationContext context, ObjectProvider<InetUtils> inetUtils) {
            return new RotaAutoRegistration(client, properties.getRegistration(), context, inetUtils.getIfAvailable());
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
    @ConditionalOnClass(OncePerRequestFilter.class)
    static class ServletVersionConfiguration {

        @Bean
        @ConditionalOnMissingBean(RotaVersionServletFilter.class)
        FilterRegistrationBean<RotaVersionServletFilter> rotaVersionServletFilter() {
            FilterRegistrationBean<RotaVersionServletFilter> registration =
                    new FilterRegistrationBean<>(new RotaVersionServletFilter());
            registration.setOrder(Ordered.HIGHEST_PRECEDENCE + 100);
            registration.setName("rotaVersionFilter");
            return registration;
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.REACTIVE)
    @ConditionalOnClass(WebFilter.class)
    static class ReactiveVersionConfiguration {

        @Bean
        @ConditionalOnMissingBean
        RotaVersionWebFilter rotaVersionWebFilter() {
            return new RotaVersionWebFilter();
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(RestTemplate.class)
    static class RestClientVersionConfiguration {

        @Bean
        @ConditionalOnMissingBean
        static RotaVersionRequestInterceptor rotaVersionRequestInterceptor() {
            return new RotaVersionRequestInterceptor();
        }

        @Bean
        static RotaVersionClientsPostProcessor rotaVersionClientsPostProcessor() {
            return new RotaVersionClientsPostProcessor(new RotaVersionRequestInterceptor());
        }

        /** For templates built with Boot's {@code RestTemplateBuilder}, beans or not. */
        @Bean
        org.springframework.boot.web.client.RestTemplateCustomizer rotaVersionRestTemplateCustomizer(
                RotaVersionRequestInterceptor interceptor) {
            return template -> {
                List<ClientHttpRequestInterceptor> interceptors = new ArrayList<>(template.getInterceptors());
                RotaVersionRequestInterceptor.installFirst(interceptors, interceptor);
                template.setInterceptors(interceptors);
            };
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(WebClient.class)
    static class WebClientVersionConfiguration {

        @Bean
        static RotaVersionWebClientPostProcessor rotaVersionWebClientPostProcessor() {
            return new RotaVersionWebClientPostProcessor(new RotaVersionExchangeFilter());
        }
    }
}
