package io.rota.spring.cloud;

import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.cloud.loadbalancer.annotation.LoadBalancerClients;
import org.springframework.cloud.loadbalancer.core.ReactorServiceInstanceLoadBalancer;

import io.rota.client.RotaClient;

/**
 * Makes every Spring Cloud load-balanced client ({@code @LoadBalanced RestTemplate},
 * {@code WebClient.Builder}, {@code RestClient.Builder}, {@code LoadBalancerClient}) pick
 * through rota. Off with {@code rota.loadbalancer.enabled=false}.
 */
@AutoConfiguration(after = RotaAutoConfiguration.class)
@ConditionalOnClass(ReactorServiceInstanceLoadBalancer.class)
@ConditionalOnBean(RotaClient.class)
@ConditionalOnProperty(prefix = "rota.loadbalancer", name = "enabled", matchIfMissing = true)
@LoadBalancerClients(defaultConfiguration = RotaLoadBalancerClientConfiguration.class)
public class RotaLoadBalancerAutoConfiguration {
}
