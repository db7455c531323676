package io.rota.client;

import java.util.Collections;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;

/**
 * One instance of a service: what a provider registers, and what picks, listings and watches
 * return. Immutable; the {@code with...} methods return changed copies.
 *
 * <pre>{@code
 * Instance instance = Instance.of("orders", "10.0.0.7", 8080).withVersion("zlt").withWeight(50);
 * }</pre>
 *
 * @param service  the service name (1 to 253 bytes of {@code [A-Za-z0-9._:-]})
 * @param id       unique within the service; empty when registering means {@code host:port}
 * @param host     where the instance listens
 * @param port     1 to 65535
 * @param version  empty means no version: the instance serves requests that ask for none
 * @param zone     the instance's zone, for zone-aware rules; may be empty
 * @param weight   {@value #DEFAULT_WEIGHT} unless registered otherwise; 0 means never picked by weighted rules
 * @param metadata free-form key/value pairs (at most 64); unmodifiable, ordered by key
 * @param status   whether the instance gets picks
 */
public record Instance(String service, String id, String host, int port, String version, String zone, int weight,
        Map<String, String> metadata, InstanceStatus status) {

    /** The weight of an instance registered without one. */
    public static final int DEFAULT_WEIGHT = 100;

    public Instance {
        Objects.requireNonNull(service, "service");
        Objects.requireNonNull(id, "id");
        Objects.requireNonNull(host, "host");
        Objects.requireNonNull(version, "version");
        Objects.requireNonNull(zone, "zone");
        Objects.requireNonNull(status, "status");
        if (weight < 0) {
            throw new IllegalArgumentException("weight must not be negative, got " + weight);
        }
        metadata = Collections.unmodifiableMap(new TreeMap<>(Objects.requireNonNull(metadata, "metadata")));
    }

    /** An {@code UP} instance with no id (rota names it {@code host:port}), version or zone, weight 100. */
    public static Instance of(String service, String host, int port) {
        return new Instance(service, "", host, port, "", "", DEFAULT_WEIGHT, Map.of(), InstanceStatus.UP);
    }

    public Instance withId(String id) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    public Instance withHost(String host) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    public Instance withPort(int port) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    public Instance withVersion(String version) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    public Instance withZone(String zone) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    public Instance withWeight(int weight) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    /** Replaces all of the metadata. */
    public Instance withMetadata(Map<String, String> metadata) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    public Instance withStatus(InstanceStatus status) {
        return new Instance(service, id, host, port, version, zone, weight, metadata, status);
    }

    /** The reference rota knows this instance by: its id, or {@code host:port} when it has none. */
    public InstanceRef ref() {
        return new InstanceRef(service, id.isEmpty() ? host + ":" + port : id);
    }

    /** {@code host:port}, with an IPv6 host in brackets: what a URL or a socket address wants. */
    public String authority() {
        return (host.indexOf(':') >= 0 ? "[" + host + "]" : host) + ":" + port;
    }
}
