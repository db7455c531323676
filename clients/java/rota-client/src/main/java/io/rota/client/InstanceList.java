package io.rota.client;

import java.util.List;

/**
 * The instances of one service, ordered by id.
 *
 * @param instances the instances
 * @param epoch     the generation of the list (an unsigned 64-bit number)
 */
public record InstanceList(List<Instance> instances, long epoch) {
    public InstanceList {
        instances = List.copyOf(instances);
    }

    /** The instance ids, in order. */
    public List<String> ids() {
        return instances.stream().map(Instance::id).toList();
    }
}
