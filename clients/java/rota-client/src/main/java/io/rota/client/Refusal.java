package io.rota.client;

import java.util.Objects;

import io.grpc.Status;

/**
 * Why rota did not apply one instance of a registration message; nothing about that instance changed.
 *
 * @param instance the instance refused
 * @param code     {@code INVALID_ARGUMENT}, {@code ALREADY_EXISTS} (another registration owns the id),
 *                 {@code NOT_FOUND}, ...
 * @param message  rota's explanation
 */
public record Refusal(InstanceRef instance, Status.Code code, String message) {
    public Refusal {
        Objects.requireNonNull(instance, "instance");
        Objects.requireNonNull(code, "code");
        Objects.requireNonNull(message, "message");
    }
}
