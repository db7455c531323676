package io.rota.client;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Objects;
import java.util.Optional;

import io.rota.v1.PickRequest;

/**
 * Everything in a pick but the service: rule, version, affinity key, zone and excluded ids.
 *
 * <pre>{@code
 * PickOptions options = PickOptions.builder().rule("repeat(n=3)").version("zlt").build();
 * }</pre>
 *
 * <p>A version that is not set follows {@link RotaVersion#current()}; set it to {@code ""} to
 * ask explicitly for instances with no version.
 */
public final class PickOptions {
    private static final PickOptions DEFAULTS = builder().build();

    private final String rule;
    private final String version;
    private final String key;
    private final String zone;
    private final List<String> exclude;

    private PickOptions(Builder builder) {
        this.rule = builder.rule;
        this.version = builder.version;
        this.key = builder.key;
        this.zone = builder.zone;
        this.exclude = List.copyOf(builder.exclude);
    }

    /** Round robin, the current version, no key, no zone, nothing excluded. */
    public static PickOptions defaults() {
        return DEFAULTS;
    }

    public static Builder builder() {
        return new Builder();
    }

    /** Shorthand for {@code builder().rule(rule).build()}. */
    public static PickOptions rule(String rule) {
        return builder().rule(rule).build();
    }

    public Builder toBuilder() {
        Builder b = new Builder().rule(rule).key(key).zone(zone).exclude(exclude);
        b.version = version;
        return b;
    }

    /** The rule, e.g. {@code "repeat(n=5)"}; empty means round robin. */
    public String getRule() {
        return rule;
    }

    /** The explicit version, or empty when the pick follows {@link RotaVersion#current()}. */
    public Optional<String> getVersion() {
        return Optional.ofNullable(version);
    }

    public String getKey() {
        return key;
    }

    public String getZone() {
        return zone;
    }

    public List<String> getExclude() {
        return exclude;
    }

    /** The request for {@code service}; an unset version is taken from {@link RotaVersion#current()}. */
    PickRequest toRequest(String service) {
        return PickRequest.newBuilder()
                .setService(Objects.requireNonNull(service, "service"))
                .setRule(rule)
                .setVersion(version != null ? version : RotaVersion.current().orElse(""))
                .setKey(key)
                .setZone(zone)
                .addAllExclude(exclude)
                .build();
    }

    @Override
    public String toString() {
        return "PickOptions{rule=" + rule + ", version=" + version + ", key=" + key + ", zone=" + zone
                + ", exclude=" + exclude + "}";
    }

    public static final class Builder {
        private String rule = "";
        private String version;
        private String key = "";
        private String zone = "";
        private final List<String> exclude = new ArrayList<>();

        private Builder() {
        }

        public Builder rule(String rule) {
            this.rule = rule == null ? "" : rule;
            return this;
        }

        /** The version to ask for; {@code ""} asks for instances with no version. */
        public Builder version(String version) {
            this.version = Objects.requireNonNull(version, "version");
            return this;
        }

        public Builder key(String key) {
            this.key = key == null ? "" : key;
            return this;
        }

        public Builder zone(String zone) {
            this.zone = zone == null ? "" : zone;
            return this;
        }

        /** Instance ids already tried by this call; they are never returned. */
        public Builder exclude(String... ids) {
            return exclude(List.of(ids));
        }

        public Builder exclude(Collection<String> ids) {
            this.exclude.addAll(ids);
            return this;
        }

        public PickOptions build() {
            return new PickOptions(this);
        }
    }
}
