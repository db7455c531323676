package io.rota.client.channel;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

import io.grpc.NameResolver;
import io.grpc.NameResolverProvider;
import io.rota.client.RotaCredentials;

/**
 * The {@value RotaChannels#SCHEME} name resolver: {@code rota:///SERVICE}, optionally
 * {@code rota://ROTA_HOST:PORT/SERVICE?rule=RULE&version=VERSION}. Registered through
 * {@code META-INF/services/io.grpc.NameResolverProvider}; see {@link RotaChannels} for the options.
 */
public final class RotaNameResolverProvider extends NameResolverProvider {
    /** Where settings a channel leaves out are looked up: the process environment, or a test's. */
    private final Function<String, String> environment;

    public RotaNameResolverProvider() {
        this(System::getenv);
    }

    RotaNameResolverProvider(Function<String, String> environment) {
        this.environment = environment;
    }

    @Override
    protected boolean isAvailable() {
        return true;
    }

    /**
     * Below DNS's 5: the registry's default scheme (for targets without one) is its highest
     * priority provider's, and that must stay DNS.
     */
    @Override
    protected int priority() {
        return 4;
    }

    @Override
    public String getDefaultScheme() {
        return RotaChannels.SCHEME;
    }

    @Override
    public Collection<Class<? extends SocketAddress>> getProducedSocketAddressTypes() {
        return List.of(InetSocketAddress.class);
    }

    @Override
    public NameResolver newNameResolver(URI target, NameResolver.Args args) {
        if (!RotaChannels.SCHEME.equals(target.getScheme())) {
            return null;
        }
        String path = target.getPath() == null ? "" : target.getPath();
        String service = path.startsWith("/") ? path.substring(1) : path;
        if (service.isEmpty() || service.contains("/")) {
            throw new IllegalArgumentException("rota target must be rota:///SERVICE, got " + target);
        }
        Map<String, String> query = query(target.getRawQuery());
        String server = firstOf(target.getAuthority(), args.getArg(RotaChannels.SERVER), environment.apply("ROTA_SERVER"),
                RotaChannels.DEFAULT_SERVER);
        RotaCredentials explicit = args.getArg(RotaChannels.CREDENTIALS);
        RotaCredentials credentials = (explicit != null ? explicit : RotaCredentials.none()).resolveFor(server, environment);
        String rule = firstOf(args.getArg(RotaChannels.RULE), query.get("rule"), "");
        String version = firstOf(args.getArg(RotaChannels.VERSION), query.get("version"), "");
        Map<String, Object> policy = new LinkedHashMap<>();
        policy.put("rule", rule);
        policy.put("version", version);
        policy.put("ticketHeader", Boolean.TRUE.equals(args.getArg(RotaChannels.TICKET_HEADER_ENABLED)));
        String authority = args.getOverrideAuthority() != null ? args.getOverrideAuthority() : service;
        return new RotaNameResolver(service, server, credentials, authority, policy, args);
    }

    private static String firstOf(String... values) {
        for (String v : values) {
            if (v != null && !v.isBlank()) {
                return v.trim();
            }
        }
        return "";
    }

    private static Map<String, String> query(String raw) {
        Map<String, String> out = new LinkedHashMap<>();
        if (raw == null || raw.isEmpty()) {
            return out;
        }
        for (String pair : raw.split("&")) {
            int eq = pair.indexOf('=');
            String key = eq < 0 ? pair : pair.substring(0, eq);
            String value = eq < 0 ? "" : pair.substring(eq + 1);
            out.put(URLDecoder.decode(key, StandardCharsets.UTF_8), URLDecoder.decode(value, StandardCharsets.UTF_8));
        }
        return out;
    }
}
