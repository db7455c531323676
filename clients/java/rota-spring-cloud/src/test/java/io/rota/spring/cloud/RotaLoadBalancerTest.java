package io.rota.spring.cloud;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.time.Duration;
import java.util.List;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.springframework.cloud.client.DefaultServiceInstance;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.loadbalancer.DefaultRequest;
import org.springframework.cloud.client.loadbalancer.EmptyResponse;
import org.springframework.cloud.client.loadbalancer.Request;
import org.springframework.cloud.client.loadbalancer.RequestData;
import org.springframework.cloud.client.loadbalancer.RequestDataContext;
import org.springframework.cloud.client.loadbalancer.Response;
import org.springframework.cloud.client.loadbalancer.RetryableRequestContext;
import org.springframework.http.HttpHeaders;
import org.springframework.http.HttpMethod;
import org.springframework.util.LinkedMultiValueMap;

import io.grpc.Status;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.RotaVersion;
import io.rota.client.testing.SharedRotaServer;

/** {@link RotaLoadBalancer} against the live server: where the version and the exclusions come from. */
@ExtendWith(SharedRotaServer.class)
class RotaLoadBalancerTest {
    private static RotaClient client;
    private static Registration registration;

    @BeforeAll
    static void register() {
        client = RotaClient.builder().target(SharedRotaServer.server().target()).build();
        registration = client.register(
                instance("a1", ""), instance("a2", ""), instance("z", "zlt"), instance("b", "bob"));
    }

    @AfterAll
    static void close() {
        registration.close();
        client.close();
    }

    private static Instance instance(String id, String version) {
        return Instance.of("conf-lb", "127.0.0.1", 9500 + id.length()).withId(id).withVersion(version);
    }

    private static Request<RequestDataContext> request(String versionHeader) {
        HttpHeaders headers = new HttpHeaders();
        if (versionHeader != null) {
            headers.set("X-Rota-Version", versionHeader);
        }
        RequestData data = new RequestData(HttpMethod.GET, URI.create("http://conf-lb/"), headers, new LinkedMultiValueMap<>(),
                new java.util.HashMap<>());
        return new DefaultRequest<>(new RequestDataContext(data));
    }

    private static RotaLoadBalancer balancer(String service, String configuredVersion) {
        RotaProperties.LoadBalancer properties = new RotaProperties.LoadBalancer();
        properties.setVersion(configuredVersion);
        properties.setFollow(false);
        return new RotaLoadBalancer(client, service, properties);
    }

    @SuppressWarnings({"rawtypes", "unchecked"})
    private static String choose(RotaLoadBalancer balancer, Request request) {
        Response<ServiceInstance> response = balancer.choose(request).block(Duration.ofSeconds(10));
        return response.hasServer() ? response.getServer().getInstanceId() : null;
    }

    @Test
    void versionComesFromTheHeaderThenTheCurrentVersionThenTheConfiguration() {
        RotaLoadBalancer plain = balancer("conf-lb", "");
        RotaLoadBalancer configured = balancer("conf-lb", "bob");
        assertEquals("z", choose(plain, request("zlt")));
        assertEquals("z", choose(configured, request("zlt")));
        RotaVersion.run("zlt", () -> assertEquals("z", choose(configured, request(null))));
        RotaVersion.run("bob", () -> assertEquals("z", choose(plain, request("zlt"))));
        assertEquals("b", choose(configured, request(null)));
        assertEquals("b", choose(configured, new DefaultRequest<>()));
        String first = choose(plain, request(null));
        String second = choose(plain, request(null));
        assertEquals(List.of("a1", "a2"), List.of(first, second).stream().sorted().toList());
    }

    @Test
    void aRetryExcludesTheInstanceTriedBefore() {
        RotaLoadBalancer plain = balancer("conf-lb", "");
        ServiceInstance tried = new DefaultServiceInstance("a1", "conf-lb", "127.0.0.1", 9502, false);
        RequestData data = new RequestData(HttpMethod.GET, URI.create("http://conf-lb/"), new HttpHeaders(),
                new LinkedMultiValueMap<>(), new java.util.HashMap<>());
        Request<RetryableRequestContext> retry = new DefaultRequest<>(new RetryableRequestContext(tried, data));
        for (int i = 0; i < 3; i++) {
            assertEquals("a2", choose(plain, retry));
        }
    }

    @Test
    void unknownOrEmptyServicesGiveAnEmptyResponse() {
        Response<ServiceInstance> unknown = balancer("conf-lb-never", "").choose(request(null)).block(Duration.ofSeconds(10));
        assertInstanceOf(EmptyResponse.class, unknown);
        assertFalse(unknown.hasServer());
        // rota's word on why, for lifecycle beans and the blocking client's error.
        RotaEmptyResponse why = assertInstanceOf(RotaEmptyResponse.class, unknown);
        assertEquals(Status.Code.NOT_FOUND, why.getCode());
        assertEquals("unknown_service", why.getFailure().reason());
        assertTrue(why.describe().startsWith("rota: NOT_FOUND: "), why.describe());
        assertTrue(why.describe().contains("\"conf-lb-never\""), why.describe());
    }
}
