package io.rota.spring.cloud;

import java.net.InetAddress;
import java.net.UnknownHostException;
import java.util.List;
import java.util.concurrent.CompletableFuture;

import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.springframework.boot.web.context.WebServerApplicationContext;
import org.springframework.cloud.commons.util.InetUtils;
import org.springframework.context.ApplicationContext;
import org.springframework.context.SmartLifecycle;
import org.springframework.core.env.Environment;

import io.rota.client.Ack;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;

/**
 * Registers this application with rota once its web server has started, and withdraws it when
 * the application context closes (before the web server stops taking requests).
 *
 * <p>Service name: {@code rota.registration.service-name}, else {@code spring.application.name}.
 * Port: {@code rota.registration.port}, else the web server's. Host:
 * {@code rota.registration.host}, else the first non-loopback address. The registration runs in
 * the background: rota being unreachable at startup does not stop the application; the client
 * keeps reconnecting.
 */
public class RotaAutoRegistration implements SmartLifecycle {
    private static final Log LOG = LogFactory.getLog(RotaAutoRegistration.class);

    private final RotaClient client;
    private final RotaProperties.Registration properties;
    private final ApplicationContext context;
    private final InetUtils inetUtils;
    private volatile Registration registration;

    public RotaAutoRegistration(RotaClient client, RotaProperties.Registration properties, ApplicationContext context,
            InetUtils inetUtils) {
        this.client = client;
        this.properties = properties;
        this.context = context;
        this.inetUtils = inetUtils;
    }

    /** The instance this application announces, or {@code null} when it cannot tell its name or port. */
    public Instance instance() {
        Environment environment = context.getEnvironment();
        String service = firstNonBlank(properties.getServiceName(), environment.getProperty("spring.application.name"));
        Integer port = properties.getPort();
        if (port == null && context instanceof WebServerApplicationContext web && web.getWebServer() != null) {
            port = web.getWebServer().getPort();
        }
        if (service == null || port == null || port <= 0) {
            return null;
        }
        String host = firstNonBlank(properties.getHost(), defaultHost());
        Instance instance = Instance.of(service, host, port)
                .withId(firstNonBlank(properties.getInstanceId(), host + ":" + port))
                .withVersion(nullToEmpty(properties.getVersion()))
                .withZone(nullToEmpty(properties.getZone()))
                .withMetadata(properties.getMetadata());
        return properties.getWeight() == null ? instance : instance.withWeight(properties.getWeight());
    }

    @Override
    public void start() {
        Instance instance = instance();
        if (instance == null) {
            LOG.warn("rota registration enabled but no service name (spring.application.name) or port is known;"
                    + " not registering");
            return;
        }
        Registration started = client.registerAsync(List.of(instance));
        registration = started;
        started.ready().whenComplete((ack, error) -> {
            if (error != null) {
                LOG.warn("rota registration of " + instance.ref() + " failed: " + error);
            } else if (!ack.refused().isEmpty()) {
                LOG.warn("rota refused " + instance.ref() + ": " + ack.refused().get(0).message());
            } else {
                LOG.info("registered with rota as " + instance.ref() + " (" + instance.authority() + ")");
            }
        });
    }

    /** Completes with rota's acknowledgement of the registration (fails when not registering). */
    public CompletableFuture<Ack> ready() {
        Registration current = registration;
        return current == null
                ? CompletableFuture.failedFuture(new IllegalStateException("not registering"))
                : current.ready();
    }

    /** The registration, or {@code null} before start or when there was nothing to register. */
    public Registration getRegistration() {
        return registration;
    }

    @Override
    public void stop() {
        Registration current = registration;
        registration = null;
        if (current != null) {
            current.close();
            LOG.info("withdrawn from rota");
        }
    }

    @Override
    public boolean isRunning() {
        return registration != null;
    }

    /** Last to start (after the web server), first to stop (before it drains). */
    @Override
    public int getPhase() {
        return SmartLifecycle.DEFAULT_PHASE;
    }

    private String defaultHost() {
        if (inetUtils != null) {
            return inetUtils.findFirstNonLoopbackHostInfo().getIpAddress();
        }
        try {
            return InetAddress.getLocalHost().getHostAddress();
        } catch (UnknownHostException e) {
            return InetAddress.getLoopbackAddress().getHostAddress();
        }
    }

    private static String firstNonBlank(String a, String b) {
        if (a != null && !a.isBlank()) {
            return a.trim();
        }
        return b != null && !b.isBlank() ? b.trim() : null;
    }

    private static String nullToEmpty(String s) {
        return s == null ? "" : s;
    }
}
