package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletionException;

import org.junit.jupiter.api.Test;

import io.grpc.Status;

/**
 * A rota that cannot be reached (a closed loopback port) is named in the error, with the
 * transport's reason, and the error still counts as unreachable.
 */
class UnreachableMessageTest {
    private static String closedPort() throws Exception {
        try (ServerSocket socket = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            return "127.0.0.1:" + socket.getLocalPort();
        }
    }

    private static void assertNamesRota(RotaException e, String target) {
        assertEquals(Status.Code.UNAVAILABLE, e.getCode());
        assertTrue(e.isUnreachable(), e.getMessage());
        assertEquals("", e.reason());
        assertTrue(e.getMessage().startsWith("UNAVAILABLE: rota at " + target + " unreachable: connection refused"),
                e.getMessage());
        assertTrue(e.getDescription().startsWith("rota at " + target), e.getDescription());
    }

    @Test
    void everyCallNamesTheAddressAndWhy() throws Exception {
        String target = closedPort();
        try (RotaClient client = RotaClient.builder().target(target).registerTimeout(Duration.ofMillis(500)).build()) {
            assertNamesRota(assertThrows(RotaException.class, () -> client.pick("orders")), target);
            CompletionException async = assertThrows(CompletionException.class,
                    () -> client.pickAsync("orders", PickOptions.defaults()).join());
            assertNamesRota((RotaException) async.getCause(), target);
            assertNamesRota(assertThrows(RotaException.class, client::listServices), target);
            assertNamesRota(assertThrows(RotaException.class, () -> client.listInstances("orders")), target);
            assertNamesRota(assertThrows(RotaException.class,
                    () -> client.report(new CallOutcome("orders", "a", 0, "round_robin", Duration.ofMillis(1), CallResult.OK))),
                    target);
            RotaException register = assertThrows(RotaException.class,
                    () -> client.register(List.of(Instance.of("orders", "127.0.0.1", 8080))));
            assertEquals(Status.Code.DEADLINE_EXCEEDED, register.getCode());
            assertTrue(register.getMessage().contains("rota at " + target), register.getMessage());
            assertTrue(register.getMessage().contains("connection refused"), register.getMessage());
        }
    }
}
