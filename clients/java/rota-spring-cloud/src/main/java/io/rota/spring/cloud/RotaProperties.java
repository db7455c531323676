package io.rota.spring.cloud;

import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

import org.springframework.boot.context.properties.ConfigurationProperties;

import io.rota.client.RotaClient;
import io.rota.client.RotaCredentials;

/**
 * Configuration of rota in a Spring Boot application ({@code rota.*}).
 *
 * <pre>
 * rota.target=127.0.0.1:50051
 * rota.loadbalancer.rule=round_robin
 * rota.loadbalancer.services.orders.rule=repeat(n=3)
 * rota.registration.enabled=true
 * # rota with tokens and TLS (each also from ROTA_TOKEN, ROTA_TLS_CA, ROTA_TLS_CERT, ROTA_TLS_KEY)
 * rota.target=https://rota.internal:50051
 * rota.token=${ORDERS_TOKEN}
 * rota.tls.ca=/etc/rota/ca.pem
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

    /**
     * Bearer token sent with every call; empty takes {@code ROTA_TOKEN} from the environment.
     */
    private String token = "";

    private final Tls tls = new Tls();

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

    public String getToken() {
        return token;
    }

    public void setToken(String token) {
        this.token = token;
    }

    public Tls getTls() {
        return tls;
    }

    /** The client settings these properties give, before the environment fills in what they leave out. */
    public RotaCredentials credentials() {
        RotaCredentials.Builder builder = RotaCredentials.builder();
        if (token != null && !token.isBlank()) {
            builder.token(token);
        }
        if (tls.ca != null) {
            builder.tlsCa(tls.ca);
        }
        if (tls.cert != null || tls.key != null) {
            if (tls.cert == null || tls.key == null) {
                throw new IllegalArgumentException("rota.tls.cert and rota.tls.key go together: set both or neither");
            }
            builder.tlsClientCertificate(tls.cert, tls.key);
        }
        return builder.build();
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

    /**
     * {@code rota.tls.*}: TLS to an {@code https://} target. Each setting left out is taken from
     * {@code ROTA_TLS_CA}, {@code ROTA_TLS_CERT} and {@code ROTA_TLS_KEY}.
     */
    public static class Tls {
        /** PEM CA that signed rota's certificate; none means the JVM's trusted CAs. */
        private Path ca;

        /** PEM client certificate, for a rota that requires mTLS (with {@code key}). */
        private Path cert;

        /** PEM private key (PKCS#8) of {@code cert}. */
        private Path key;

        public Path getCa() {
            return ca;
        }

        public void setCa(Path ca) {
            this.ca = ca;
        }

        public Path getCert() {
            return cert;
        }

        public void setCert(Path cert) {
            this.cert = cert;
        }

        public Path getKey() {
            return key;
        }

        public void setKey(Path key) {
            this.key = key;
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
