package io.rota.client;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Objects;
import java.util.concurrent.Executor;
import java.util.function.Function;

import io.grpc.CallCredentials;
import io.grpc.ChannelCredentials;
import io.grpc.CompositeChannelCredentials;
import io.grpc.InsecureChannelCredentials;
import io.grpc.Metadata;
import io.grpc.TlsChannelCredentials;

/**
 * How a client proves itself to rota: a bearer token and TLS (the CA that signed rota's
 * certificate, and a client certificate with its key for a rota that requires mTLS).
 *
 * <pre>{@code
 * RotaCredentials credentials = RotaCredentials.builder()
 *         .token(System.getenv("ORDERS_TOKEN"))
 *         .tlsCa(Path.of("/etc/rota/ca.pem"))
 *         .tlsClientCertificate(Path.of("/etc/rota/client.pem"), Path.of("/etc/rota/client.key"))
 *         .build();
 * }</pre>
 *
 * <p>As with the {@code rota} command line, every setting left out is taken from the environment
 * ({@link #orFromEnvironment}): {@value #TOKEN_ENV}, {@value #TLS_CA_ENV}, {@value #TLS_CERT_ENV}
 * and {@value #TLS_KEY_ENV}; a setting given explicitly wins. The client certificate and its key
 * go together. TLS is used for an {@code https://} target: its certificate must chain to the CA
 * given, or without one to a CA the JVM trusts (its default trust store). TLS settings given
 * explicitly for a plaintext target are refused; those of the environment are not used for one.
 * The token is sent as {@code authorization: Bearer TOKEN} with every call, over TLS or not.
 */
public final class RotaCredentials {
    /** The bearer token's environment variable. */
    public static final String TOKEN_ENV = "ROTA_TOKEN";
    /** The environment variable naming the PEM CA to trust for an {@code https://} rota. */
    public static final String TLS_CA_ENV = "ROTA_TLS_CA";
    /** The environment variable naming the PEM client certificate (mTLS). */
    public static final String TLS_CERT_ENV = "ROTA_TLS_CERT";
    /** The environment variable naming the PEM private key of the client certificate. */
    public static final String TLS_KEY_ENV = "ROTA_TLS_KEY";

    private static final String HTTPS = "https://";
    private static final String HTTP = "http://";
    private static final Metadata.Key<String> AUTHORIZATION =
            Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    private static final RotaCredentials NONE = new RotaCredentials(null, null, null, null);

    private final String token;
    private final Path ca;
    private final Path cert;
    private final Path key;

    private RotaCredentials(String token, Path ca, Path cert, Path key) {
        this.token = token;
        this.ca = ca;
        this.cert = cert;
        this.key = key;
    }

    /** No token and no TLS settings (an {@code https://} target still gets TLS, with the JVM's CAs). */
    public static RotaCredentials none() {
        return NONE;
    }

    public static Builder builder() {
        return new Builder();
    }

    /** These settings, each one left out taken from the process environment. */
    public RotaCredentials orFromEnvironment() {
        return orFrom(System::getenv);
    }

    /**
     * These settings, each one left out taken from {@code environment} (a variable's value by its
     * name, {@code null} when unset). The certificate and key are taken as a pair.
     *
     * @throws IllegalArgumentException when the environment names a certificate without its key,
     *     or the other way round, or its token cannot be sent as a header
     */
    public RotaCredentials orFrom(Function<String, String> environment) {
        String envToken = nonBlank(environment.apply(TOKEN_ENV));
        String envCa = nonBlank(environment.apply(TLS_CA_ENV));
        String envCert = nonBlank(environment.apply(TLS_CERT_ENV));
        String envKey = nonBlank(environment.apply(TLS_KEY_ENV));
        if ((envCert == null) != (envKey == null)) {
            throw new IllegalArgumentException(TLS_CERT_ENV + " and " + TLS_KEY_ENV + " go together: "
                    + (envCert == null ? TLS_KEY_ENV : TLS_CERT_ENV) + " is set, the other is not");
        }
        String newToken = token != null ? token : envToken == null ? null : checkedToken(envToken);
        Path newCa = ca != null ? ca : envCa == null ? null : Path.of(envCa);
        boolean explicitPair = cert != null;
        Path newCert = explicitPair ? cert : envCert == null ? null : Path.of(envCert);
        Path newKey = explicitPair ? key : envKey == null ? null : Path.of(envKey);
        return new RotaCredentials(newToken, newCa, newCert, newKey);
    }

    /** Whether a token is sent. */
    public boolean hasToken() {
        return token != null;
    }

    /** The CA to trust, when one was given. */
    public Path tlsCa() {
        return ca;
    }

    /** The client certificate, when one was given (its key is {@link #tlsKey}). */
    public Path tlsCert() {
        return cert;
    }

    /** The private key of {@link #tlsCert}. */
    public Path tlsKey() {
        return key;
    }

    /** Whether {@code target} is reached over TLS: it starts with {@code https://}. */
    public static boolean isTls(String target) {
        return target.trim().startsWith(HTTPS);
    }

    /** {@code target} without its {@code http://} or {@code https://} scheme and trailing {@code /}. */
    public static String address(String target) {
        String t = Objects.requireNonNull(target, "target").trim();
        if (t.startsWith(HTTPS)) {
            t = t.substring(HTTPS.length());
        } else if (t.startsWith(HTTP)) {
            t = t.substring(HTTP.length());
        }
        return t.endsWith("/") ? t.substring(0, t.length() - 1) : t;
    }

    /**
     * The channel credentials for {@code target}: TLS for an {@code https://} target, plaintext
     * otherwise, with the token on every call when there is one.
     *
     * @throws IllegalArgumentException when a TLS file cannot be read
     */
    public ChannelCredentials channelCredentials(String target) {
        ChannelCredentials transport;
        if (isTls(target)) {
            TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
            try {
                if (ca != null) {
                    tls.trustManager(readable(ca, TLS_CA_ENV).toFile());
                }
                if (cert != null) {
                    tls.keyManager(readable(cert, TLS_CERT_ENV).toFile(), readable(key, TLS_KEY_ENV).toFile());
                }
            } catch (java.io.IOException e) {
                throw new IllegalArgumentException("cannot use the TLS files: " + e.getMessage(), e);
            }
            transport = tls.build();
        } else {
            transport = InsecureChannelCredentials.create();
        }
        return token == null ? transport : CompositeChannelCredentials.create(transport, new BearerToken(token));
    }

    /**
     * The settings to reach {@code target} with: these, each one left out taken from
     * {@code environment} ({@link #orFrom}).
     *
     * @throws IllegalArgumentException when TLS settings are given explicitly for a plaintext
     *     target (they would be ignored), or as {@link #orFrom} does
     */
    public RotaCredentials resolveFor(String target, Function<String, String> environment) {
        if (!isTls(target) && (ca != null || cert != null)) {
            throw new IllegalArgumentException(
                    "TLS settings (tlsCa, tlsClientCertificate) need an https:// target, got " + target.trim());
        }
        return orFrom(environment);
    }

    private static Path readable(Path path, String setting) {
        if (!Files.isReadable(path)) {
            throw new IllegalArgumentException(setting + ": cannot read " + path);
        }
        return path;
    }

    private static String nonBlank(String value) {
        return value == null || value.isBlank() ? null : value.trim();
    }

    /** A header value is visible ASCII: a token with anything else could not be sent. */
    private static String checkedToken(String token) {
        for (int i = 0; i < token.length(); i++) {
            char c = token.charAt(i);
            if (c < 0x21 || c > 0x7e) {
                throw new IllegalArgumentException(
                        "the token cannot be sent as a header: it contains characters outside visible ASCII");
            }
        }
        return token;
    }

    @Override
    public String toString() {
        // Never the token itself.
        return "RotaCredentials{token=" + (token == null ? "none" : "set") + ", tlsCa=" + ca + ", tlsCert=" + cert
                + ", tlsKey=" + key + "}";
    }

    /** Builds {@link RotaCredentials}; every setting is optional. */
    public static final class Builder {
        private String token;
        private Path ca;
        private Path cert;
        private Path key;

        private Builder() {
        }

        /** The bearer token, sent as {@code authorization: Bearer TOKEN}. */
        public Builder token(String token) {
            this.token = checkedToken(Objects.requireNonNull(nonBlank(token), "token must not be blank"));
            return this;
        }

        /** The PEM CA certificate(s) rota's certificate must chain to. */
        public Builder tlsCa(Path ca) {
            this.ca = Objects.requireNonNull(ca, "ca");
            return this;
        }

        /** The PEM client certificate chain and its PEM private key (PKCS#8), for a rota that requires mTLS. */
        public Builder tlsClientCertificate(Path cert, Path key) {
            this.cert = Objects.requireNonNull(cert, "cert");
            this.key = Objects.requireNonNull(key, "key");
            return this;
        }

        public RotaCredentials build() {
            return new RotaCredentials(token, ca, cert, key);
        }
    }

    /** {@code authorization: Bearer TOKEN} on every call. */
    private static final class BearerToken extends CallCredentials {
        private final String value;

        BearerToken(String token) {
            this.value = "Bearer " + token;
        }

        @Override
        public void applyRequestMetadata(RequestInfo requestInfo, Executor appExecutor, MetadataApplier applier) {
            Metadata headers = new Metadata();
            headers.put(AUTHORIZATION, value);
            applier.apply(headers);
        }
    }
}
