package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.Map;

import org.junit.jupiter.api.Test;

import io.grpc.ChannelCredentials;
import io.grpc.CompositeChannelCredentials;
import io.grpc.InsecureChannelCredentials;

/** How explicit settings and the environment combine, as on the rota command line. */
class RotaCredentialsTest {
    private static final Map<String, String> ENVIRONMENT = Map.of(RotaCredentials.TOKEN_ENV, "env-token-0123456789",
            RotaCredentials.TLS_CA_ENV, "/env/ca.pem", RotaCredentials.TLS_CERT_ENV, "/env/client.pem",
            RotaCredentials.TLS_KEY_ENV, "/env/client.key");

    @Test
    void explicitSettingsWinAndTheRestComeFromTheEnvironment() {
        RotaCredentials explicit = RotaCredentials.builder().tlsCa(Path.of("/explicit/ca.pem")).build();
        RotaCredentials resolved = explicit.resolveFor("https://rota:50051", ENVIRONMENT::get);
        assertEquals(Path.of("/explicit/ca.pem"), resolved.tlsCa());
        assertEquals(Path.of("/env/client.pem"), resolved.tlsCert());
        assertEquals(Path.of("/env/client.key"), resolved.tlsKey());
        assertTrue(resolved.hasToken());
        assertFalse(RotaCredentials.none().resolveFor("rota:50051", name -> null).hasToken());
    }

    @Test
    void theCertificateAndKeyGoTogether() {
        RotaCredentials explicit = RotaCredentials.builder()
                .tlsClientCertificate(Path.of("/explicit/client.pem"), Path.of("/explicit/client.key")).build();
        RotaCredentials resolved = explicit.resolveFor("https://rota:50051", ENVIRONMENT::get);
        assertEquals(Path.of("/explicit/client.key"), resolved.tlsKey(), "an explicit pair is never mixed with the environment's");

        Map<String, String> certOnly = Map.of(RotaCredentials.TLS_CERT_ENV, "/env/client.pem");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> RotaCredentials.none().resolveFor("https://rota:50051", certOnly::get));
        assertEquals("ROTA_TLS_CERT and ROTA_TLS_KEY go together: ROTA_TLS_CERT is set, the other is not", e.getMessage());
    }

    @Test
    void explicitTlsSettingsNeedAnHttpsTarget() {
        RotaCredentials explicit = RotaCredentials.builder().tlsCa(Path.of("/explicit/ca.pem")).build();
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> explicit.resolveFor("rota:50051", name -> null));
        assertEquals("TLS settings (tlsCa, tlsClientCertificate) need an https:// target, got rota:50051", e.getMessage());
        // The environment's TLS settings are not used for a plaintext target, and are no error.
        ChannelCredentials plain = RotaCredentials.none().resolveFor("http://rota:50051", ENVIRONMENT::get)
                .channelCredentials("http://rota:50051");
        assertTrue(plain instanceof CompositeChannelCredentials token
                && token.getChannelCredentials() instanceof InsecureChannelCredentials, plain.toString());
    }

    @Test
    void aTokenThatCannotBeAHeaderIsRefused() {
        assertThrows(IllegalArgumentException.class, () -> RotaCredentials.builder().token("two words"));
        assertThrows(IllegalArgumentException.class, () -> RotaCredentials.none()
                .resolveFor("rota:50051", Map.of(RotaCredentials.TOKEN_ENV, "caf\u00e9-token")::get));
        assertEquals("rota:50051", RotaCredentials.address("https://rota:50051/"));
    }
}
