package io.rota.spring.cloud;

import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.springframework.cloud.client.DefaultServiceInstance;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.loadbalancer.DefaultResponse;
import org.springframework.cloud.client.loadbalancer.EmptyResponse;
import org.springframework.cloud.client.loadbalancer.Request;
import org.springframework.cloud.client.loadbalancer.RequestData;
import org.springframework.cloud.client.loadbalancer.RequestDataContext;
import org.springframework.cloud.client.loadbalancer.Response;
import org.springframework.cloud.client.loadbalancer.RetryableRequestContext;
import org.springframework.cloud.loadbalancer.core.ReactorServiceInstanceLoadBalancer;
import org.springframework.http.HttpHeaders;

import io.grpc.Status;
import io.rota.client.Instance;
import io.rota.client.Pick;
import io.rota.client.PickOptions;
import io.rota.client.RotaClient;
import io.rota.client.RotaException;
import io.rota.client.RotaVersion;
import reactor.core.publisher.Mono;

/**
 * A Spring Cloud load balancer that asks rota for every pick of one service.
 *
 * <p>The rule comes from {@code rota.loadbalancer.services.<id>.rule}, else
 * {@code rota.loadbalancer.rule}. The version is, first found: the request's
 * {@code X-Rota-Version} header, the current {@link RotaVersion}, the configured version of the
 * service, the global configured version. A retry excludes the instance tried before. When rota
 * says the service is unknown or has nothing eligible (or cannot be reached and no local fallback
 * answers), the answer is a {@link RotaEmptyResponse} (an {@link EmptyResponse} carrying rota's
 * status and message), logged at WARNING.
 */
public class RotaLoadBalancer implements ReactorServiceInstanceLoadBalancer {
    private static final Log LOG = LogFactory.getLog(RotaLoadBalancer.class);

    /** Metadata keys added to the chosen {@link ServiceInstance}. */
    public static final String TICKET = "rota.ticket";
    public static final String RULE = "rota.rule";
    public static final String EPOCH = "rota.epoch";
    public static final String VERSION = "rota.version";
    public static final String FALLBACK = "rota.fallback";
    public static final String LOCAL_FALLBACK = "rota.local-fallback";

    private final RotaClient client;
    private final String serviceId;
    private final RotaProperties.LoadBalancer properties;

    public RotaLoadBalancer(RotaClient client, String serviceId, RotaProperties.LoadBalancer properties) {
        this.client = client;
        this.serviceId = serviceId;
        this.properties = properties;
        if (properties.isFollow()) {
            client.follow(serviceId);
        }
    }

    public String getServiceId() {
        return serviceId;
    }

    @Override
    @SuppressWarnings("rawtypes")
    public Mono<Response<ServiceInstance>> choose(Request request) {
        // Read the version now, on the caller's thread, where the current version lives.
        PickOptions options = options(request);
        return Mono.fromFuture(() -> client.pickAsync(serviceId, options))
                .map(pick -> (Response<ServiceInstance>) new DefaultResponse(serviceInstance(pick)))
                .onErrorResume(RotaException.class, e -> {
                    Status.Code code = e.getCode();
                    if (code == Status.Code.NOT_FOUND || code == Status.Code.UNAVAILABLE) {
                        RotaEmptyResponse empty = new RotaEmptyResponse(e);
                        // At WARNING, as Spring's own load balancers log a service without instances.
                        if (LOG.isWarnEnabled()) {
                            LOG.warn("No instance of " + serviceId + " from " + empty.describe());
                        }
                        return Mono.just(empty);
                    }
                    return Mono.error(e);
                });
    }

    /** The pick options for one request. */
    @SuppressWarnings("rawtypes")
    PickOptions options(Request request) {
        PickOptions.Builder options = PickOptions.builder()
                .rule(properties.ruleFor(serviceId))
                .version(version(request));
        Object context = request == null ? null : request.getContext();
        if (context instanceof RetryableRequestContext retry && retry.getPreviousServiceInstance() != null
                && retry.getPreviousServiceInstance().getInstanceId() != null) {
            options.exclude(retry.getPreviousServiceInstance().getInstanceId());
        }
        return options.build();
    }

    @SuppressWarnings("rawtypes")
    private String version(Request request) {
        Object context = request == null ? null : request.getContext();
        if (context instanceof RequestDataContext data) {
            RequestData clientRequest = data.getClientRequest();
            HttpHeaders headers = clientRequest == null ? null : clientRequest.getHeaders();
            String header = headers == null ? null : headers.getFirst(RotaVersion.HEADER);
            if (header != null && !header.isBlank()) {
                return header.trim();
            }
        }
        return RotaVersion.current().orElseGet(() -> properties.versionFor(serviceId));
    }

    static ServiceInstance serviceInstance(Pick pick) {
        Instance instance = pick.instance();
        Map<String, String> metadata = new LinkedHashMap<>(instance.metadata());
        // Tickets and epochs are unsigned 64-bit numbers.
        metadata.put(TICKET, Long.toUnsignedString(pick.ticket()));
        metadata.put(RULE, pick.rule());
        metadata.put(EPOCH, Long.toUnsignedString(pick.epoch()));
        metadata.put(VERSION, instance.version());
        if (pick.isFallback()) {
            metadata.put(FALLBACK, pick.fallback());
        }
        if (pick.localFallback()) {
            metadata.put(LOCAL_FALLBACK, "true");
        }
        boolean secure = Boolean.parseBoolean(instance.metadata().getOrDefault("secure", "false"));
        return new DefaultServiceInstance(instance.id(), instance.service(), instance.host(), instance.port(), secure,
                metadata);
    }

    @Override
    public String toString() {
        return "RotaLoadBalancer{" + serviceId + "}";
    }
}
