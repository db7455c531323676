package io.rota.client;

import java.util.Objects;

/**
 * One service known to rota.
 *
 * @param name      the service name
 * @param instances how many instances are registered
 * @param up        how many of them are {@code UP}
 * @param epoch     the generation of its instance list (an unsigned 64-bit number)
 */
public record ServiceSummary(String name, int instances, int up, long epoch) {
    public ServiceSummary {
        Objects.requireNonNull(name, "name");
    }
}
