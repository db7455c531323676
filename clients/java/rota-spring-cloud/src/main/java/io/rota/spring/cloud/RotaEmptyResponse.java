package io.rota.spring.cloud;

import java.util.Objects;

import org.springframework.cloud.client.loadbalancer.EmptyResponse;

import io.grpc.Status;
import io.rota.client.RotaException;

/**
 * The {@link EmptyResponse} of a {@link RotaLoadBalancer}: no instance, and rota's word on why
 * (its status, message and {@code rota-error} reason, e.g. {@code NOT_FOUND} for a service that was
 * never registered, {@code UNAVAILABLE} with {@code no_eligible_instance}), for load-balancer
 * lifecycle beans and whoever calls {@code choose} directly.
 */
public class RotaEmptyResponse extends EmptyResponse {
    private final RotaException failure;

    public RotaEmptyResponse(RotaException failure) {
        this.failure = Objects.requireNonNull(failure, "failure");
    }

    /** rota's refusal (or the failure to reach it) that left the request without an instance. */
    public RotaException getFailure() {
        return failure;
    }

    /** The status code, e.g. {@code NOT_FOUND}. */
    public Status.Code getCode() {
        return failure.getCode();
    }

    /** {@code rota: CODE: message [reason]}, as it is logged and reported. */
    public String describe() {
        return "rota: " + failure.getMessage() + (failure.reason().isEmpty() ? "" : " [" + failure.reason() + "]");
    }

    @Override
    public String toString() {
        return "RotaEmptyResponse{" + describe() + "}";
    }
}
