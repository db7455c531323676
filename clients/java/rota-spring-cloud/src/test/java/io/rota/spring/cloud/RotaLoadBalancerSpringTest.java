package io.rota.spring.cloud;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.extension.ExtendWith;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.web.server.LocalServerPort;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.loadbalancer.LoadBalanced;
import org.springframework.cloud.client.loadbalancer.LoadBalancerClient;
import org.springframework.cloud.loadbalancer.support.LoadBalancerClientFactory;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Import;
import org.springframework.http.RequestEntity;
import org.springframework.test.annotation.DirtiesContext;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.client.RestTemplate;
import org.springframework.web.reactive.function.client.WebClient;

import io.rota.client.Instance;
import io.rota.client.Pick;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.RotaVersion;
import io.rota.client.testing.SharedRotaServer;

/**
 * A Spring Boot application whose {@code @LoadBalanced} clients pick through a live rota: two
 * unversioned providers and one of version {@code zlt}, registered with rota by the test.
 */
@ExtendWith(SharedRotaServer.class)
@SpringBootTest(classes = RotaLoadBalancerSpringTest.App.class, webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT,
        properties = {
                "spring.application.name=conf-spring-self",
                "rota.registration.enabled=true",
                "rota.registration.host=127.0.0.1",
                "rota.registration.version=self-test",
                "rota.loadbalancer.services.conf-spring-repeat.rule=repeat(n=2)",
                "spring.main.banner-mode=off",
                "spring.cloud.loadbalancer.cache.enabled=false"
        })
@DirtiesContext(classMode = DirtiesContext.ClassMode.AFTER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class RotaLoadBalancerSpringTest {
    private static final List<FakeProvider> PROVIDERS = new ArrayList<>();
    private static RotaClient providerClient;
    private static Registration registration;

    @SpringBootConfiguration
    @EnableAutoConfiguration
    @Import(RelayController.class)
    static class App {
        @Bean
        @LoadBalanced
        RestTemplate restTemplate() {
            return new RestTemplate();
        }

        @Bean
        @LoadBalanced
        WebClient.Builder webClientBuilder() {
            return WebClient.builder();
        }
    }

    /** Calls conf-spring while handling a request, setting no header itself. */
    @RestController
    static class RelayController {
        private final RestTemplate restTemplate;
        private final WebClient webClient;

        RelayController(RestTemplate restTemplate, WebClient.Builder webClientBuilder) {
            this.restTemplate = restTemplate;
            this.webClient = webClientBuilder.build();
        }

        @GetMapping("/relay")
        String relay() {
            return restTemplate.getForObject("http://conf-spring/", String.class);
        }

        @GetMapping("/relay-webclient")
        String relayWebClient() {
            return webClient.get().uri("http://conf-spring/").retrieve().bodyToMono(String.class).block(Duration.ofSeconds(10));
        }
    }

    @DynamicPropertySource
    static void rota(DynamicPropertyRegistry registry) {
        registry.add("rota.target", () -> SharedRotaServer.server().target());
    }

    @BeforeAll
    static void registerProviders() throws Exception {
        for (String id : List.of("p1", "p2", "pz")) {
            PROVIDERS.add(new FakeProvider(id));
        }
        providerClient = RotaClient.builder().target(SharedRotaServer.server().target()).build();
        List<Instance> instances = new ArrayList<>();
        for (FakeProvider provider : PROVIDERS) {
            instances.add(Instance.of("conf-spring", "127.0.0.1", provider.port()).withId(provider.id())
                    .withVersion(provider.id().equals("pz") ? "zlt" : ""));
        }
        instances.add(Instance.of("conf-spring-repeat", "127.0.0.1", 9901).withId("r1"));
        instances.add(Instance.of("conf-spring-repeat", "127.0.0.1", 9902).withId("r2"));
        registration = providerClient.register(instances);
        assertEquals(5, registration.ack().accepted().size());
    }

    @AfterAll
    static void stopProviders() {
        if (registration != null) {
            registration.close();
        }
        if (providerClient != null) {
            providerClient.close();
        }
        PROVIDERS.forEach(FakeProvider::close);
    }

    @Autowired
    RestTemplate restTemplate;

    @Autowired
    WebClient.Builder webClientBuilder;

    @Autowired
    LoadBalancerClient loadBalancerClient;

    @Autowired
    LoadBalancerClientFactory loadBalancerClientFactory;

    @Autowired
    RotaAutoRegistration autoRegistration;

    @Autowired
    RotaClient rotaClient;

    @LocalServerPort
    int port;

    @Test
    @Order(1)
    void loadBalancedRestTemplateAlternatesBetweenTheTwoProviders() {
        List<String> answers = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            answers.add(restTemplate.getForObject("http://conf-spring/", String.class));
        }
        assertEquals(List.of("p1", "p2", "p1", "p2", "p1", "p2"), answers);
        assertInstanceOf(RotaLoadBalancer.class, loadBalancerClientFactory.getInstance("conf-spring"));
    }

    @Test
    @Order(2)
    void versionHeaderReachesTheZltInstance() {
        RequestEntity<Void> request = RequestEntity.get(URI.create("http://conf-spring/")).header("X-Rota-Version", "zlt").build();
        assertEquals("pz", restTemplate.exchange(request, String.class).getBody());
        assertEquals("pz", restTemplate.exchange(request, String.class).getBody());
        // The unversioned rotation went on where it was.
        assertEquals("p1", restTemplate.getForObject("http://conf-spring/", String.class));
    }

    @Test
    @Order(3)
    void incomingVersionFollowsTheCallChain() throws Exception {
        HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
        URI relay = URI.create("http://127.0.0.1:" + port + "/relay");
        HttpRequest withVersion = HttpRequest.newBuilder(relay).header("X-Rota-Version", "zlt").timeout(Duration.ofSeconds(10)).build();
        HttpRequest without = HttpRequest.newBuilder(relay).timeout(Duration.ofSeconds(10)).build();
        assertEquals("pz", http.send(withVersion, HttpResponse.BodyHandlers.ofString()).body());
        assertEquals("p2", http.send(without, HttpResponse.BodyHandlers.ofString()).body());

        URI relayWebClient = URI.create("http://127.0.0.1:" + port + "/relay-webclient");
        assertEquals("pz", http.send(HttpRequest.newBuilder(relayWebClient).header("X-Rota-Version", "zlt")
                .timeout(Duration.ofSeconds(10)).build(), HttpResponse.BodyHandlers.ofString()).body());
        assertEquals("p1", http.send(HttpRequest.newBuilder(relayWebClient).timeout(Duration.ofSeconds(10)).build(),
                HttpResponse.BodyHandlers.ofString()).body());
    }

    @Test
    @Order(4)
    void loadBalancedWebClientPicksThroughRota() {
        WebClient webClient = webClientBuilder.build();
        assertEquals("p2", webClient.get().uri("http://conf-spring/").retrieve().bodyToMono(String.class)
                .block(Duration.ofSeconds(10)));
        assertEquals("pz", webClient.get().uri("http://conf-spring/").header("X-Rota-Version", "zlt").retrieve()
                .bodyToMono(String.class).block(Duration.ofSeconds(10)));
        RotaVersion.run("zlt", () -> assertEquals("pz", webClient.get().uri("http://conf-spring/").retrieve()
                .bodyToMono(String.class).block(Duration.ofSeconds(10))));
        RotaVersion.run("zlt", () -> assertEquals("pz", restTemplate.getForObject("http://conf-spring/", String.class)));
        assertEquals("p1", webClient.get().uri("http://conf-spring/").retrieve().bodyToMono(String.class)
                .block(Duration.ofSeconds(10)));
    }

    @Test
    void perServiceRuleAndPickDetailsReachTheServiceInstance() {
        List<String> ids = new ArrayList<>();
        ServiceInstance first = null;
        for (int i = 0; i < 4; i++) {
            ServiceInstance instance = loadBalancerClient.choose("conf-spring-repeat");
            first = first == null ? instance : first;
            ids.add(instance.getInstanceId());
        }
        assertEquals(List.of("r1", "r1", "r2", "r2"), ids);
        assertEquals("conf-spring-repeat", first.getServiceId());
        assertEquals("127.0.0.1", first.getHost());
        assertEquals(9901, first.getPort());
        assertEquals("repeat(n=2)", first.getMetadata().get(RotaLoadBalancer.RULE));
        assertEquals("0", first.getMetadata().get(RotaLoadBalancer.TICKET));
        assertEquals("", first.getMetadata().get(RotaLoadBalancer.VERSION));
        assertNull(first.getMetadata().get(RotaLoadBalancer.LOCAL_FALLBACK));
    }

    @Test
    void unknownServiceHasNoInstance() {
        assertNull(loadBalancerClient.choose("conf-spring-missing"));
        IllegalStateException e = assertThrows(IllegalStateException.class,
                () -> restTemplate.getForObject("http://conf-spring-missing/", String.class));
        // Spring's message, with what rota answered and rota's failure as the cause.
        assertTrue(e.getMessage().startsWith("No instances available for conf-spring-missing: rota: NOT_FOUND: "), e.getMessage());
        assertTrue(e.getMessage().contains("\"conf-spring-missing\""), e.getMessage());
        assertTrue(e.getMessage().endsWith("[unknown_service]"), e.getMessage());
        io.rota.client.RotaException cause = assertInstanceOf(io.rota.client.RotaException.class, e.getCause());
        assertEquals(io.grpc.Status.Code.NOT_FOUND, cause.getCode());
        assertInstanceOf(RotaBlockingLoadBalancerClient.class, loadBalancerClient);
    }

    @Test
    void applicationRegistersItself() throws Exception {
        autoRegistration.ready().get(10, TimeUnit.SECONDS);
        Pick self = rotaClient.pick("conf-spring-self", io.rota.client.PickOptions.builder().version("self-test").build());
        assertEquals("127.0.0.1:" + port, self.id());
        assertEquals("127.0.0.1", self.host());
        assertEquals(port, self.port());
        assertEquals("self-test", self.version());
        assertEquals("", self.fallback());
    }
}
