package io.rota.client;

import java.util.List;
import java.util.Objects;

/**
 * One event of a service's {@linkplain RotaClient#watch(String) watch}: a {@link Snapshot} of every
 * instance first, then an {@link Added}, {@link Updated} or {@link Removed} per change. Each carries
 * the epoch of the service's instance list after it.
 *
 * <pre>{@code
 * if (event instanceof WatchEvent.Added added) {
 *     connect(added.instance());
 * }
 * }</pre>
 */
public sealed interface WatchEvent permits WatchEvent.Snapshot, WatchEvent.Added, WatchEvent.Updated, WatchEvent.Removed {
    /** The service's epoch after this event. An unsigned 64-bit number in a {@code long}. */
    long epoch();

    /** Every instance of the service (any status), ordered by id; always the first event of a watch. */
    record Snapshot(long epoch, List<Instance> instances) implements WatchEvent {
        public Snapshot {
            instances = List.copyOf(instances);
        }
    }

    /** An instance was registered. */
    record Added(long epoch, Instance instance) implements WatchEvent {
        public Added {
            Objects.requireNonNull(instance, "instance");
        }
    }

    /** An instance changed: its status, weight or metadata, or it was announced again. */
    record Updated(long epoch, Instance instance) implements WatchEvent {
        public Updated {
            Objects.requireNonNull(instance, "instance");
        }
    }

    /** An instance left: withdrawn, its registration closed or expired. */
    record Removed(long epoch, InstanceRef instance) implements WatchEvent {
        public Removed {
            Objects.requireNonNull(instance, "instance");
        }
    }
}
