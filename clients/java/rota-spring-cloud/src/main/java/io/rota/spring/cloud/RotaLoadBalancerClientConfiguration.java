package io.rota.spring.cloud;

import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.cloud.loadbalancer.support.LoadBalancerClientFactory;
import org.springframework.context.annotation.Bean;
import org.springframework.core.env.Environment;

import io.rota.client.RotaClient;

/**
 * The load balancer of each Spring Cloud load-balancer client context: one {@link RotaLoadBalancer}
 * per service id. Installed for every client by {@link RotaLoadBalancerAutoConfiguration}; a client
 * with its own {@code ReactorLoadBalancer} keeps it.
 *
 * <p>Deliberately not a {@code @Configuration}: it belongs in the per-service contexts only, and
 * component scanning must not put it in the application context.
 */
public class RotaLoadBalancerClientConfiguration {

    @Bean
    @ConditionalOnMissingBean
    public RotaLoadBalancer rotaLoadBalancer(Environment environment, RotaClient client, RotaProperties properties) {
        return new RotaLoadBalancer(client, LoadBalancerClientFactory.getName(environment), properties.getLoadbalancer());
    }

    @Bean
    @ConditionalOnMissingBean
    @ConditionalOnProperty(prefix = "rota.loadbalancer", name = "report-outcomes", matchIfMissing = true)
    public RotaOutcomeReporter rotaOutcomeReporter(RotaClient client) {
        return new RotaOutcomeReporter(client);
    }
}
