package io.rota.client.testing;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.Key;
import java.security.KeyStore;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A certificate authority, a server certificate for {@code localhost} / {@code 127.0.0.1} and a
 * client certificate, made with the JDK's {@code keytool} in a fresh directory: every file PEM,
 * the private keys RSA in PKCS#8 (which both rota and grpc-java read).
 */
public final class TestCertificates {
    private static final String PASSWORD = "rota-test";
    private static final long KEYTOOL_TIMEOUT_SECONDS = 60;

    public final Path dir;
    public final Path ca;
    public final Path serverCert;
    public final Path serverKey;
    public final Path clientCert;
    public final Path clientKey;

    private TestCertificates(Path dir) {
        this.dir = dir;
        this.ca = dir.resolve("ca.pem");
        this.serverCert = dir.resolve("server.pem");
        this.serverKey = dir.resolve("server.key");
        this.clientCert = dir.resolve("client.pem");
        this.clientKey = dir.resolve("client.key");
    }

    /** Makes the CA (named {@code name}) and the two certificates it signs. */
    public static TestCertificates create(String name) throws IOException, InterruptedException {
        Path target = Files.createDirectories(Paths.get(System.getProperty("user.dir"), "target"));
        Path dir = Files.createTempDirectory(target, "certs-" + name);
        TestCertificates certs = new TestCertificates(dir);
        Path caStore = dir.resolve("ca.p12");
        keytool("-genkeypair", "-alias", "ca", "-keyalg", "EC", "-groupname", "secp256r1", "-dname", "CN=" + name,
                "-ext", "bc:c", "-ext", "ku:c=keyCertSign,cRLSign", "-validity", "2", "-keystore", caStore.toString());
        keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore", caStore.toString(), "-file", certs.ca.toString());
        certs.leaf(caStore, "server", "CN=rota", "serverAuth", "san=dns:localhost,ip:127.0.0.1", certs.serverCert,
                certs.serverKey);
        certs.leaf(caStore, "client", "CN=consumer", "clientAuth", null, certs.clientCert, certs.clientKey);
        return certs;
    }

    private void leaf(Path caStore, String alias, String dname, String usage, String san, Path cert, Path key)
            throws IOException, InterruptedException {
        Path store = dir.resolve(alias + ".p12");
        Path request = dir.resolve(alias + ".csr");
        // RSA: the PKCS#8 encoding the JDK gives an EC key leaves out the public key, which
        // rota's key loader (ring) requires.
        keytool("-genkeypair", "-alias", alias, "-keyalg", "RSA", "-keysize", "2048", "-dname", dname,
                "-validity", "2", "-keystore", store.toString());
        keytool("-certreq", "-alias", alias, "-keystore", store.toString(), "-file", request.toString());
        List<String> sign = new ArrayList<>(List.of("-gencert", "-rfc", "-alias", "ca", "-keystore", caStore.toString(),
                "-infile", request.toString(), "-outfile", cert.toString(), "-validity", "2", "-ext", "eku=" + usage));
        if (san != null) {
            sign.addAll(List.of("-ext", san));
        }
        keytool(sign.toArray(String[]::new));
        try (var in = Files.newInputStream(store)) {
            KeyStore keys = KeyStore.getInstance("PKCS12");
            keys.load(in, PASSWORD.toCharArray());
            Key privateKey = keys.getKey(alias, PASSWORD.toCharArray());
            String body = Base64.getMimeEncoder(64, "\n".getBytes(StandardCharsets.US_ASCII))
                    .encodeToString(privateKey.getEncoded());
            Files.writeString(key, "-----BEGIN PRIVATE KEY-----\n" + body + "\n-----END PRIVATE KEY-----\n");
        } catch (java.security.GeneralSecurityException e) {
            throw new IOException("cannot read the key keytool made", e);
        }
    }

    private static void keytool(String... args) throws IOException, InterruptedException {
        List<String> command = new ArrayList<>();
        command.add(Paths.get(System.getProperty("java.home"), "bin", "keytool").toString());
        command.addAll(List.of(args));
        command.addAll(List.of("-storetype", "PKCS12", "-storepass", PASSWORD, "-noprompt"));
        if (!args[0].equals("-exportcert")) {
            command.addAll(List.of("-keypass", PASSWORD));
        }
        Process process = new ProcessBuilder(command).redirectErrorStream(true).start();
        byte[] output = process.getInputStream().readAllBytes();
        if (!process.waitFor(KEYTOOL_TIMEOUT_SECONDS, TimeUnit.SECONDS) || process.exitValue() != 0) {
            process.destroyForcibly();
            throw new IOException("keytool " + String.join(" ", args) + " failed: "
                    + new String(output, StandardCharsets.UTF_8));
        }
    }
}
