package io.rota.spring.cloud;

import java.io.IOException;

import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.loadbalancer.LoadBalancerRequest;
import org.springframework.cloud.client.loadbalancer.Request;
import org.springframework.cloud.client.loadbalancer.Response;
import org.springframework.cloud.client.loadbalancer.reactive.ReactiveLoadBalancer;
import org.springframework.cloud.loadbalancer.blocking.client.BlockingLoadBalancerClient;

import reactor.core.publisher.Mono;

/**
 * Spring Cloud's blocking {@code LoadBalancerClient} (behind {@code @LoadBalanced RestTemplate}
 * and {@code RestClient}), whose "No instances available for SERVICE" also says what rota
 * answered: {@code No instances available for nosuch: rota: NOT_FOUND: service "nosuch" ...},
 * with rota's {@link io.rota.client.RotaException} as the cause. Everything else is Spring's.
 */
public class RotaBlockingLoadBalancerClient extends BlockingLoadBalancerClient {
    /** Where {@link #choose} leaves rota's refusal for the {@link #execute} running on this thread. */
    private static final ThreadLocal<RotaEmptyResponse[]> REFUSAL = new ThreadLocal<>();

    private final ReactiveLoadBalancer.Factory<ServiceInstance> factory;

    public RotaBlockingLoadBalancerClient(ReactiveLoadBalancer.Factory<ServiceInstance> factory) {
        super(factory);
        this.factory = factory;
    }

    @Override
    public <T> T execute(String serviceId, LoadBalancerRequest<T> request) throws IOException {
        RotaEmptyResponse[] refusal = new RotaEmptyResponse[1];
        RotaEmptyResponse[] outer = REFUSAL.get();
        REFUSAL.set(refusal);
        try {
            return super.execute(serviceId, request);
        } catch (IllegalStateException e) {
            if (refusal[0] != null && ("No instances available for " + serviceId).equals(e.getMessage())) {
                IllegalStateException explained = new IllegalStateException(e.getMessage() + ": " + refusal[0].describe(),
                        refusal[0].getFailure());
                explained.addSuppressed(e);
                throw explained;
            }
            throw e;
        } finally {
            if (outer == null) {
                REFUSAL.remove();
            } else {
                REFUSAL.set(outer);
            }
        }
    }

    @Override
    public <T> ServiceInstance choose(String serviceId, Request<T> request) {
        // As Spring's own, keeping the response to see whether rota said why there is none.
        ReactiveLoadBalancer<ServiceInstance> loadBalancer = factory.getInstance(serviceId);
        if (loadBalancer == null) {
            return null;
        }
        Response<ServiceInstance> response = Mono.from(loadBalancer.choose(request)).block();
        if (response == null) {
            return null;
        }
        RotaEmptyResponse[] refusal = REFUSAL.get();
        if (refusal != null) {
            refusal[0] = response instanceof RotaEmptyResponse empty ? empty : null;
        }
        return response.getServer();
    }
}
