package io.rota.client.channel;

import io.grpc.LoadBalancerRegistry;
import io.grpc.Metadata;
import io.grpc.NameResolver;
import io.rota.client.RotaCredentials;

/**
 * Names and options of rota's gRPC channel integration: the {@value #SCHEME} name resolver and
 * the {@value #POLICY} load-balancing policy, both registered through {@code META-INF/services},
 * so a channel built for {@code rota:///SERVICE} routes every RPC by rota's rotation.
 *
 * <pre>{@code
 * ManagedChannel channel = Grpc.newChannelBuilder("rota:///orders", InsecureChannelCredentials.create())
 *         .setNameResolverArg(RotaChannels.SERVER, "10.0.0.5:50051")      // else ROTA_SERVER
 *         .setNameResolverArg(RotaChannels.RULE, "repeat(n=3)")          // else the service's policy rule
 *         .build();
 *
 * // rota with tokens and TLS: https:// and, unless ROTA_TOKEN and ROTA_TLS_CA say so, credentials
 * ManagedChannel secured = Grpc.newChannelBuilder("rota:///orders", InsecureChannelCredentials.create())
 *         .setNameResolverArg(RotaChannels.SERVER, "https://rota.internal:50051")
 *         .setNameResolverArg(RotaChannels.CREDENTIALS, RotaCredentials.builder()
 *                 .token(token).tlsCa(Path.of("/etc/rota/ca.pem")).build())
 *         .build();
 * }</pre>
 *
 * <p>The rota server is, in this order: the target's authority ({@code rota://HOST:PORT/orders}),
 * {@link #SERVER}, the {@code ROTA_SERVER} environment variable, {@code 127.0.0.1:50051};
 * {@code https://HOST:PORT} reaches it over TLS with the {@link #CREDENTIALS}. The
 * resolver publishes the service config {@code {"loadBalancingConfig": [{"rota": {"rule": ...,
 * "version": ...}}]}} with {@link #RULE} and {@link #VERSION}; a channel that sets its own
 * service config ({@code defaultServiceConfig(...)} with {@code disableServiceConfigLookUp()})
 * configures the policy there instead.
 *
 * <p>Under xDS ({@code xds:///orders} with {@code io.grpc:grpc-xds}, rota as the control plane),
 * {@link #registerXdsPolicy} makes rota's clusters use the same leased rotation: rota names its
 * policy {@value #XDS_POLICY} first in each cluster it can lease (gRFC A52), and a client with it
 * registered routes by rota's tickets over the endpoints xDS gives it.
 */
public final class RotaChannels {
    /** The target scheme: {@code rota:///SERVICE}. */
    public static final String SCHEME = "rota";
    /** The load-balancing policy name, for {@code loadBalancingConfig}. */
    public static final String POLICY = "rota";
    /** The rota server, {@code host:port}. */
    public static final NameResolver.Args.Key<String> SERVER = NameResolver.Args.Key.create("rota.server");
    /**
     * The token and TLS settings to reach rota with; each one left out is taken from
     * {@code ROTA_TOKEN}, {@code ROTA_TLS_CA}, {@code ROTA_TLS_CERT} and {@code ROTA_TLS_KEY}
     * (see {@link RotaCredentials}). TLS is used when the server is {@code https://HOST:PORT}.
     */
    public static final NameResolver.Args.Key<RotaCredentials> CREDENTIALS = NameResolver.Args.Key.create("rota.credentials");
    /** The rule, one rota leases (e.g. {@code round_robin}, {@code repeat(n=N)}, {@code weighted}); default: the service's policy rule. */
    public static final NameResolver.Args.Key<String> RULE = NameResolver.Args.Key.create("rota.rule");
    /** The version RPCs without an {@value #VERSION_HEADER} header ask for; default none. */
    public static final NameResolver.Args.Key<String> VERSION = NameResolver.Args.Key.create("rota.version");
    /**
     * When true, every RPC carries its ticket in the {@value #TICKET_HEADER} header, for
     * providers that log or check the rotation. Default false.
     */
    public static final NameResolver.Args.Key<Boolean> TICKET_HEADER_ENABLED = NameResolver.Args.Key.create("rota.ticket-header");

    /** Per-call version: an RPC with this header is routed within that version's instances. */
    public static final String VERSION_HEADER = "x-rota-version";
    /** The ticket an RPC was routed by (when {@link #TICKET_HEADER_ENABLED}); {@code L<n>} for a local pick. */
    public static final String TICKET_HEADER = "x-rota-ticket";

    static final Metadata.Key<String> VERSION_KEY = Metadata.Key.of(VERSION_HEADER, Metadata.ASCII_STRING_MARSHALLER);
    static final Metadata.Key<String> TICKET_KEY = Metadata.Key.of(TICKET_HEADER, Metadata.ASCII_STRING_MARSHALLER);

    /** Where {@code rota serve} listens by default. */
    public static final String DEFAULT_SERVER = "127.0.0.1:50051";

    /** Least and most tickets one lease reserves; between them the block follows the RPC rate. */
    public static final int MIN_BLOCK = 16;
    public static final int MAX_BLOCK = 8192;
    /** The interval between leases the block size aims at, at a steady RPC rate. */
    public static final long TARGET_LEASE_INTERVAL_MS = 75;

    /**
     * The name of rota's xDS policy: the last part of the type URL of the {@code TypedStruct} rota's
     * clusters carry ({@code type.googleapis.com/rota.v1.CentralRotation}).
     */
    public static final String XDS_POLICY = "rota.v1.CentralRotation";

    /** The policy registered by {@link #registerXdsPolicy}, to replace on the next call. */
    private static RotaXdsLoadBalancerProvider xdsPolicy;

    private RotaChannels() {
    }

    /** {@link #registerXdsPolicy(String, XdsPolicyOptions)} with the defaults (no ticket header). */
    public static void registerXdsPolicy(String rotaTarget) {
        registerXdsPolicy(rotaTarget, XdsPolicyOptions.defaults());
    }

    /**
     * Registers rota's xDS policy ({@value #XDS_POLICY}) in grpc's default load-balancer registry,
     * leasing from the rota server at {@code rotaTarget} ({@code host:port}, or a target with a
     * scheme). Call it before the first {@code xds:///} channel gets its clusters: grpc-xds looks
     * the name up when it parses a Cluster, and a client without it takes the cluster's next policy
     * (grpc's own). Each cluster's balancer then leases tickets of {@code Balancer.Lease(service,
     * rule, version)} from the cluster's config, takes each ticket's instance from the lease as a
     * {@code rota:///} channel does, and sends the RPC to the endpoint with that instance's
     * {@code host:port}; an instance xDS did not give (not pushed yet, another locality, not
     * healthy) is unusable: its tickets are passed over for the next ones, and the next lease
     * excludes it. While rota cannot be reached, RPCs
     * follow a local rotation over the last list. A second call replaces the first registration;
     * channels already balancing keep theirs.
     *
     * @throws IllegalArgumentException when {@code rotaTarget} is blank
     */
    public static synchronized void registerXdsPolicy(String rotaTarget, XdsPolicyOptions options) {
        if (rotaTarget == null || rotaTarget.isBlank()) {
            throw new IllegalArgumentException("registerXdsPolicy needs rota's address (host:port)");
        }
        RotaXdsLoadBalancerProvider provider = new RotaXdsLoadBalancerProvider(new RotaLoadBalancer.XdsSettings(
                rotaTarget.trim(), RotaCredentials.none().resolveFor(rotaTarget, System::getenv), options.ticketHeader()));
        deregisterXdsPolicy();
        LoadBalancerRegistry.getDefaultRegistry().register(provider);
        xdsPolicy = provider;
    }

    /** Removes the policy {@link #registerXdsPolicy} registered, if any: new clusters take their next policy. */
    public static synchronized void deregisterXdsPolicy() {
        if (xdsPolicy != null) {
            LoadBalancerRegistry.getDefaultRegistry().deregister(xdsPolicy);
            xdsPolicy = null;
        }
    }
}
