package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.junit.jupiter.api.Test;

import io.grpc.Status;
import io.rota.client.testing.PublicApi;

/** The client's own model, its conversions to and from the wire, and what the public API exposes. */
class ModelTest {

    @Test
    void thePublicApiExposesNoGeneratedType() throws Exception {
        assertEquals(List.of(), PublicApi.uses(RotaClient.class, "io.rota.v1."));
        // The scan sees the public members: RotaClient.channel() does expose a gRPC type.
        assertTrue(PublicApi.uses(RotaClient.class, "io.grpc.").contains("io.rota.client.RotaClient.channel: io.grpc.Channel"));
    }

    @Test
    void instancesHaveRotaDefaultsAndAreImmutable() {
        Instance plain = Instance.of("orders", "10.0.0.7", 8080);
        assertEquals(new Instance("orders", "", "10.0.0.7", 8080, "", "", 100, Map.of(), InstanceStatus.UP), plain);
        assertEquals(new InstanceRef("orders", "10.0.0.7:8080"), plain.ref());
        assertEquals(new InstanceRef("orders", "o1"), plain.withId("o1").ref());
        assertEquals("[::1]:8080", plain.withHost("::1").authority());

        Map<String, String> metadata = new LinkedHashMap<>(Map.of("team", "payments"));
        Instance tagged = plain.withMetadata(metadata);
        metadata.put("team", "other");
        assertEquals(Map.of("team", "payments"), tagged.metadata());
        assertThrows(UnsupportedOperationException.class, () -> tagged.metadata().put("x", "y"));
        assertThrows(IllegalArgumentException.class, () -> plain.withWeight(-1));
    }

    @Test
    void instancesRoundTripThroughTheWire() {
        Instance full = Instance.of("orders", "10.0.0.7", 8080).withId("o1").withVersion("zlt").withZone("eu-1")
                .withWeight(0).withMetadata(Map.of("a", "1")).withStatus(InstanceStatus.DRAINING);
        assertEquals(full, Wire.instance(Wire.instance(full)));
        // Unset on the wire: weight 100, status UP.
        io.rota.v1.Instance bare = io.rota.v1.Instance.newBuilder().setService("orders").setHost("h").setPort(1).build();
        assertEquals(Instance.of("orders", "h", 1), Wire.instance(bare));
    }

    @Test
    void acksAndUpdatesConvert() {
        io.rota.v1.Ack message = io.rota.v1.Ack.newBuilder().setLeaseId(-1L).setSeq(2).setHeartbeatTimeoutMs(15_000)
                .addAccepted(io.rota.v1.InstanceRef.newBuilder().setService("s").setId("a"))
                .addRefused(io.rota.v1.Refusal.newBuilder().setCode(6).setMessage("owned by another registration")
                        .setInstance(io.rota.v1.InstanceRef.newBuilder().setService("s").setId("b")))
                .build();
        Ack ack = Wire.ack(message);
        assertEquals("18446744073709551615", Long.toUnsignedString(ack.leaseId()));
        assertEquals(List.of("a"), ack.acceptedIds());
        assertEquals(List.of(new Refusal(new InstanceRef("s", "b"), Status.Code.ALREADY_EXISTS, "owned by another registration")),
                ack.refused());
        assertEquals(Duration.ofSeconds(15), ack.heartbeatTimeout());

        InstanceRef ref = new InstanceRef("s", "a");
        assertEquals(io.rota.v1.Update.newBuilder().setInstance(Wire.ref(ref)).build(), Wire.update(Update.of(ref)));
        Update drain = Update.of(ref).withStatus(InstanceStatus.DRAINING).withWeight(7).withMetadata(Map.of("k", "v"));
        assertEquals(io.rota.v1.Update.newBuilder().setInstance(Wire.ref(ref)).setStatus(io.rota.v1.InstanceStatus.DRAINING)
                .setWeight(7).setMetadata(io.rota.v1.Metadata.newBuilder().putEntries("k", "v")).build(), Wire.update(drain));
        Instance before = Instance.of("s", "h", 1).withId("a");
        assertEquals(before.withStatus(InstanceStatus.DRAINING).withWeight(7).withMetadata(Map.of("k", "v")),
                drain.applyTo(before));
    }
}
