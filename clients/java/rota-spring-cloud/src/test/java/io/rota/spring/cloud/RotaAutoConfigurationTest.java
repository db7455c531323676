package io.rota.spring.cloud;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.cloud.loadbalancer.core.RoundRobinLoadBalancer;
import org.springframework.cloud.loadbalancer.support.LoadBalancerClientFactory;
import org.springframework.context.ConfigurableApplicationContext;

import io.grpc.Status;
import io.rota.client.Pick;
import io.rota.client.RotaClient;
import io.rota.client.RotaException;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;

/** What the auto-configuration sets up, and the self-registration's life cycle. */
@ExtendWith(SharedRotaServer.class)
class RotaAutoConfigurationTest {
    private final ApplicationContextRunner runner = new ApplicationContextRunner()
            .withConfiguration(AutoConfigurations.of(RotaAutoConfiguration.class, RotaLoadBalancerAutoConfiguration.class,
                    org.springframework.cloud.loadbalancer.config.LoadBalancerAutoConfiguration.class,
                    org.springframework.cloud.client.loadbalancer.LoadBalancerAutoConfiguration.class))
            .withPropertyValues("rota.target=127.0.0.1:1");

    @Test
    void everyLoadBalancerClientPicksThroughRota() {
        runner.run(context -> {
            assertEquals(1, context.getBeansOfType(RotaClient.class).size());
            assertFalse(context.containsBean("rotaAutoRegistration"));
            RotaProperties properties = context.getBean(RotaProperties.class);
            assertEquals("127.0.0.1:1", properties.getTarget());
            LoadBalancerClientFactory factory = context.getBean(LoadBalancerClientFactory.class);
            RotaLoadBalancer balancer = assertInstanceOf(RotaLoadBalancer.class, factory.getInstance("orders"));
            assertEquals("orders", balancer.getServiceId());
            assertEquals(1, factory.getInstances("orders", RotaOutcomeReporter.class).size());
            assertEquals(java.util.Set.of("orders"), context.getBean(RotaClient.class).followed());
        });
    }

    @Test
    void propertiesBindPerServiceOverrides() {
        runner.withPropertyValues("rota.loadbalancer.rule=random", "rota.loadbalancer.version=v1",
                "rota.loadbalancer.services.orders.rule=repeat(n=4)", "rota.loadbalancer.services.orders.version=zlt",
                "rota.pick-timeout=750ms", "rota.loadbalancer.follow=false").run(context -> {
                    RotaProperties.LoadBalancer lb = context.getBean(RotaProperties.class).getLoadbalancer();
                    assertEquals("repeat(n=4)", lb.ruleFor("orders"));
                    assertEquals("zlt", lb.versionFor("orders"));
                    assertEquals("random", lb.ruleFor("billing"));
                    assertEquals("v1", lb.versionFor("billing"));
                    assertEquals(Duration.ofMillis(750), context.getBean(RotaProperties.class).getPickTimeout());
                    context.getBean(LoadBalancerClientFactory.class).getInstance("orders");
                    assertEquals(java.util.Set.of(), context.getBean(RotaClient.class).followed());
                });
    }

    @Test
    void loadBalancerCanBeSwitchedOff() {
        runner.withPropertyValues("rota.loadbalancer.enabled=false").run(context -> {
            assertEquals(1, context.getBeansOfType(RotaClient.class).size());
            assertInstanceOf(RoundRobinLoadBalancer.class,
                    context.getBean(LoadBalancerClientFactory.class).getInstance("orders"));
        });
        runner.withPropertyValues("rota.enabled=false").run(context -> {
            assertEquals(0, context.getBeansOfType(RotaClient.class).size());
            assertInstanceOf(RoundRobinLoadBalancer.class,
                    context.getBean(LoadBalancerClientFactory.class).getInstance("orders"));
        });
    }

    @SpringBootConfiguration
    @EnableAutoConfiguration
    static class SelfRegisteringApp {
    }

    @Test
    void selfRegistrationIsWithdrawnWhenTheContextCloses(RotaServer rota) throws Exception {
        ConfigurableApplicationContext app = new SpringApplicationBuilder(SelfRegisteringApp.class)
                .web(WebApplicationType.SERVLET)
                .properties("server.port=0", "server.address=127.0.0.1", "spring.application.name=conf-spring-closing",
                        "rota.target=" + rota.target(), "rota.registration.enabled=true",
                        "rota.registration.host=127.0.0.1", "rota.registration.metadata.team=payments",
                        "rota.registration.weight=7", "spring.main.banner-mode=off")
                .run();
        try (RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            int port;
            try {
                port = ((WebServerApplicationContext) app).getWebServer().getPort();
                app.getBean(RotaAutoRegistration.class).ready().get(10, java.util.concurrent.TimeUnit.SECONDS);
                Pick pick = client.pick("conf-spring-closing");
                assertEquals(port, pick.port());
                assertEquals("payments", pick.instance().metadata().get("team"));
                assertEquals(7, pick.instance().weight());
                assertEquals(List.of("127.0.0.1:" + port), client.listInstances("conf-spring-closing").ids());
            } finally {
                app.close();
            }
            assertTrue(port > 0);
            RotaException gone = assertThrows(RotaException.class, () -> client.pick("conf-spring-closing"));
            assertEquals(Status.Code.UNAVAILABLE, gone.getCode());
            assertEquals(List.of(), client.listInstances("conf-spring-closing").instances());
        }
    }
}
