package io.rota.spring.cloud;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

import org.springframework.boot.context.properties.ConfigurationProperties;

import io.rota.client.RotaClient;

/**
 * Configuration of rota in a Spring Boot application ({@code rota.*}).
 *
 * <pre>
 * rota.target=127.0.0.1:50051
 * rota.loadbalancer.rule=round_robin
 * rota.loadbalancer.services.orders.rule=repeat(n=3)
 * rota.registration.enabled=true
 * </pre>
 */
@ConfigurationProperties(prefix = "rota")
public class RotaProperties {
    /** Whether to set up rota at all. */
    private boolean enabled = true;

    /** {@code host:port} of the rota server. */
    private String target = RotaClient.DEFAULT_TARGET;

    /** Deadline of one pick; past it the pick counts as rota being unreachable. */
    private Duration pickTimeout = Duration.ofSeconds(2);

    private final LoadBalancer loadbalancer = new LoadBalancer();

    private final Registration registration = new Registration();

    public boolean isEnabled() {
        return enabled;
    }

    public void setEnabled(boolean enabled) {
        this.enabled = enabled;
    }

    public String getTarget() {
        return target;
    }

    public void setTarget(String target) {
        this.target = target;
    }

    public Duration getPickTimeout() {
        return pickTimeout;
    }

    public void setPickTimeout(Duration pickTimeout) {
        this.pickTimeout = pickTimeout;
    }

    public LoadBalancer getLoadbalancer() {
        return loadbalancer;
    }

    public Registration getRegistration() {
        return registration;
    }

    /** {@code rota.loadbalancer.*}: how load-balanced clients pick. */
    public static class LoadBalancer {
        /** Whether every Spring Cloud load-balanced client picks through rota. */
        private boolean enabled = true;

        /** Rule for every service, e.g. {@code repeat(n=3)}; empty means round robin. */
        private String rule = "";

        /** Version for every service when the request carries none; empty means no version. */
        private String version = "";

        /** Follow each service through Watch, so that picks survive rota being unreachable. */
        private boolean follow = true;

        /** Report the outcome and latency of each load-balanced call to rota. */
        private boolean reportOutcomes = true;

        /** Per service overrides, by service id. */
        private Map<String, Service> services = new LinkedHashMap<>();

        public boolean isEnabled() {
            return enabled;
        }

        public void setEnabled(boolean enabled) {
            this.enabled = enabled;
        }

        public String getRule() {
            return rule;
        }

        public void setRule(String rule) {
            this.rule = rule;
        }

        public String getVersion() {
            return version;
        }

        public void setVersion(String version) {
            this.version = version;
        }

        public boolean isFollow() {
            return follow;
        }

        public void setFollow(boolean follow) {
            this.follow = follow;
        }

        public boolean isReportOutcomes() {
            return reportOutcomes;
        }

        public void setReportOutcomes(boolean reportOutcomes) {
            this.reportOutcomes = reportOutcomes;
        }

        public Map<String, Service> getServices() {
            return services;
        }

        public void setServices(Map<String, Service> services) {
            this.services = services;
        }

        /** The rule for {@code serviceId}: its override, else the global rule. */
        public String ruleFor(String serviceId) {
            Service service = services.get(serviceId);
            return service != null && service.getRule() != null ? service.getRule() : nullToEmpty(rule);
        }

        /** The configured version for {@code serviceId}: its override, else the global version. */
        public String versionFor(String serviceId) {
            Service service = services.get(serviceId);
            return service != null && service.getVersion() != null ? service.getVersion() : nullToEmpty(version);
        }

        private static String nullToEmpty(String s) {
            return s == null ? "" : s;
        }
    }

    /** {@code rota.loadbalancer.services.<id>.*}. */
    public static class Service {
        /** Rule for this service. */
        private String rule;

        /** Version for this service when the request carries none. */
        private String version;

        public String getRule() {
            return rule;
        }

        public void setRule(String rule) {
            this.rule = rule;
        }

        public String getVersion() {
            return version;
        }

        public void setVersion(String version) {
            this.version = version;
        }
    }

    /** {@code rota.registration.*}: registering this application with rota. */
    public static class Registration {
        /** Register this application's web server with rota once it has started. */
        private boolean enabled = false;

        /** Service name; defaults to {@code spring.application.name}. */
        private String serviceName;

        /** Instance id; defaults to {@code host:port}. */
        private String instanceId;

        /** Host to announce; defaults to the first non-loopback address. */
        private String host;

        /** Port to announce; defaults to the port the web server listens on. */
        private Integer port;

        /** Version this instance serves; empty means requests with no version. */
        private String version = "";

        private String zone = "";

        /** Weight for weighted rules; unset means rota's default (100). */
        private Integer weight;

        private Map<String, String> metadata = new LinkedHashMap<>();

        public boolean isEnabled() {
            return enabled;
        }

        public void setEnabled(boolean enabled) {
            this.enabled = enabled;
        }

        public String getServiceName() {
            return serviceName;
        }

        public void setServiceName(String serviceName) {
            this.serviceName = serviceName;
        }

        public String getInstanceId() {
            return instanceId;
        }

        public void setInstanceId(String instanceId) {
            this.instanceId = instanceId;
        }

        public String getHost() {
            return host;
        }

        public void setHost(String host) {
            this.host = host;
        }

        public Integer getPort() {
            return port;
        }

        public void setPort(Integer port) {
            this.port = port;
        }

        public String getVersion() {
            return version;
        }

        public void setVersion(String version) {
            this.version = version;
        }

        public String getZone() {
            return zone;
        }

        public void setZone(String zone) {
            this.zone = zone;
        }

        public Integer getWeight() {
            return weight;
        }

        public void setWeight(Integer weight) {
            this.weight = weight;
        }

        public Map<String, String> getMetadata() {
            return metadata;
        }

        public void setMetadata(Map<String, String> metadata) {
            this.metadata = metadata;
        }
    }
}
