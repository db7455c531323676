package io.rota.client;

import java.util.Collections;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.TreeMap;

/**
 * Changes to one instance of a registration; what is left empty keeps its value.
 *
 * <pre>{@code
 * registration.update(Update.of(instance.ref()).withStatus(InstanceStatus.DRAINING));
 * }</pre>
 *
 * @param instance the instance to change
 * @param status   its new status
 * @param weight   its new weight
 * @param metadata its new metadata, replacing all of the old
 */
public record Update(InstanceRef instance, Optional<InstanceStatus> status, OptionalInt weight,
        Optional<Map<String, String>> metadata) {
    public Update {
        Objects.requireNonNull(instance, "instance");
        Objects.requireNonNull(status, "status");
        Objects.requireNonNull(weight, "weight");
        weight.ifPresent(w -> {
            if (w < 0) {
                throw new IllegalArgumentException("weight must not be negative, got " + w);
            }
        });
        metadata = metadata.map(m -> Collections.unmodifiableMap(new TreeMap<>(m)));
    }

    /** An update that changes nothing yet. */
    public static Update of(InstanceRef instance) {
        return new Update(instance, Optional.empty(), OptionalInt.empty(), Optional.empty());
    }

    public Update withStatus(InstanceStatus status) {
        return new Update(instance, Optional.of(status), weight, metadata);
    }

    public Update withWeight(int weight) {
        return new Update(instance, status, OptionalInt.of(weight), metadata);
    }

    public Update withMetadata(Map<String, String> metadata) {
        return new Update(instance, status, weight, Optional.of(metadata));
    }

    /** {@code current} with this update's changes. */
    Instance applyTo(Instance current) {
        Instance changed = current;
        if (status.isPresent()) {
            changed = changed.withStatus(status.get());
        }
        if (weight.isPresent()) {
            changed = changed.withWeight(weight.getAsInt());
        }
        if (metadata.isPresent()) {
            changed = changed.withMetadata(metadata.get());
        }
        return changed;
    }
}
