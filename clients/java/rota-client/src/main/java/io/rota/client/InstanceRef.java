package io.rota.client;

import java.util.Objects;

/**
 * Names one instance of one service.
 *
 * @param service the service
 * @param id      the instance's id within the service
 */
public record InstanceRef(String service, String id) {
    public InstanceRef {
        Objects.requireNonNull(service, "service");
        Objects.requireNonNull(id, "id");
    }

    @Override
    public String toString() {
        return service + "/" + id;
    }
}
