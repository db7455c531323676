package io.rota.spring.cloud;

import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.cloud.client.loadbalancer.LoadBalancerClient;
import org.springframework.cloud.loadbalancer.annotation.LoadBalancerClients;
import org.springframework.cloud.loadbalancer.config.BlockingLoadBalancerClientAutoConfiguration;
import org.springframework.cloud.loadbalancer.config.LoadBalancerAutoConfiguration;
import org.springframework.cloud.loadbalancer.core.ReactorServiceInstanceLoadBalancer;
import org.springframework.cloud.loadbalancer.support.LoadBalancerClientFactory;
import org.springframework.context.annotation.Bean;
import org.springframework.web.client.RestTemplate;

import io.rota.client.RotaClient;

/**
 * Makes every Spring Cloud load-balanced client ({@code @LoadBalanced RestTemplate},
 * {@code WebClient.Builder}, {@code RestClient.Builder}, {@code LoadBalancerClient}) pick
 * through rota; the blocking client's "No instances available" error says what rota answered.
 * Off with {@code rota.loadbalancer.enabled=false}.
 */
@AutoConfiguration(after = {RotaAutoConfiguration.class, LoadBalancerAutoConfiguration.class},
        before = BlockingLoadBalancerClientAutoConfiguration.class)
@ConditionalOnClass(ReactorServiceInstanceLoadBalancer.class)
@ConditionalOnBean(RotaClient.class)
@ConditionalOnProperty(prefix = "rota.loadbalancer", name = "enabled", matchIfMissing = true)
@LoadBalancerClients(defaultConfiguration = RotaLoadBalancerClientConfiguration.class)
public class RotaLoadBalancerAutoConfiguration {

    /**
     * Spring's blocking load-balancer client, whose "No instances available" error carries rota's
     * status and message; an application's own {@code LoadBalancerClient} wins.
     */
    @Bean
    @ConditionalOnMissingBean(LoadBalancerClient.class)
    @ConditionalOnBean(LoadBalancerClientFactory.class)
    @ConditionalOnClass(RestTemplate.class)
    public LoadBalancerClient rotaBlockingLoadBalancerClient(LoadBalancerClientFactory loadBalancerClientFactory) {
        return new RotaBlockingLoadBalancerClient(loadBalancerClientFactory);
    }
}
