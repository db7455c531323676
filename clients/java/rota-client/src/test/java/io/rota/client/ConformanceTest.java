package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;

import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.extension.ExtendWith;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.grpc.Status;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;
import io.rota.v1.Ack;
import io.rota.v1.Instance;
import io.rota.v1.InstanceRef;
import io.rota.v1.InstanceStatus;
import io.rota.v1.PickRequest;
import io.rota.v1.Refusal;

/**
 * Runs every scenario of {@code clients/conformance/scenarios/} against the shared live server,
 * with the step semantics of {@code clients/conformance/README.md}.
 */
@ExtendWith(SharedRotaServer.class)
class ConformanceTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    @TestFactory
    Stream<DynamicTest> scenarios(RotaServer rota) throws IOException {
        Path dir = RotaServer.repositoryRoot().resolve("clients/conformance/scenarios");
        List<Path> files;
        try (Stream<Path> listing = Files.list(dir)) {
            files = listing.filter(p -> p.getFileName().toString().endsWith(".json")).sorted().toList();
        }
        assertFalse(files.isEmpty(), "no scenarios in " + dir);
        return files.stream().map(file -> DynamicTest.dynamicTest(file.getFileName().toString(), file.toUri(),
                () -> Assertions.assertTimeoutPreemptively(Duration.ofSeconds(60),
                        () -> run(rota, JSON.readTree(file.toFile())))));
    }

    private static void run(RotaServer rota, JsonNode scenario) {
        String name = scenario.path("name").asText();
        int connections = scenario.path("connections").asInt(1);
        List<RotaClient> clients = new ArrayList<>();
        Map<String, Registration> streams = new LinkedHashMap<>();
        RotaClient provider = client(rota);
        try {
            for (int i = 0; i < connections; i++) {
                clients.add(client(rota));
            }
            JsonNode steps = scenario.path("steps");
            for (int index = 0; index < steps.size(); index++) {
                JsonNode step = steps.get(index);
                String where = "scenario \"" + name + "\", step " + index + " (" + step.path("op").asText() + ")";
                try {
                    runStep(step, provider, clients, streams);
                } catch (AssertionError | RuntimeException e) {
                    throw new AssertionError(where + ": " + e.getMessage(), e);
                }
            }
        } finally {
            streams.values().forEach(Registration::close);
            clients.forEach(RotaClient::close);
            provider.close();
        }
    }

    private static RotaClient client(RotaServer rota) {
        return RotaClient.builder().target(rota.target()).pickTimeout(Duration.ofSeconds(10)).build();
    }

    private static void runStep(JsonNode step, RotaClient provider, List<RotaClient> clients,
            Map<String, Registration> streams) {
        switch (step.path("op").asText()) {
            case "register" -> register(step, provider, streams);
            case "withdraw" -> {
                Registration registration = streams.remove(step.path("stream").asText());
                if (registration == null) {
                    fail("no open stream named " + step.path("stream").asText());
                }
                registration.withdraw();
                registration.close();
            }
            case "pick" -> {
                RotaClient client = clients.get(step.path("connection").asInt(0));
                checkPick(client, request(step.path("request")), step.path("expect"));
            }
            case "pick_sequence" -> pickSequence(step, clients);
            case "list" -> {
                List<String> ids = clients.get(0).listInstances(step.path("service").asText()).getInstancesList()
                        .stream().map(Instance::getId).toList();
                assertEquals(strings(step.path("expect_ids")), ids, "listed ids");
            }
            default -> fail("unknown op " + step.path("op"));
        }
    }

    private static void register(JsonNode step, RotaClient provider, Map<String, Registration> streams) {
        List<Instance> instances = new ArrayList<>();
        for (JsonNode node : step.path("instances")) {
            instances.add(instance(node));
        }
        String name = step.path("stream").asText();
        Registration open = streams.get(name);
        Ack ack;
        if (open == null) {
            Registration registration = provider.register(instances);
            streams.put(name, registration);
            ack = registration.ack();
        } else {
            ack = open.announce(instances);
        }
        List<String> accepted = ack.getAcceptedList().stream().map(InstanceRef::getId).toList();
        Set<String> refused = new HashSet<>();
        for (Refusal refusal : ack.getRefusedList()) {
            refused.add(refusal.getInstance().getId() + "=" + refusal.getCode());
        }
        if (step.has("expect_accepted") || step.has("expect_refused")) {
            assertEquals(strings(step.path("expect_accepted")), accepted, "accepted ids");
            Set<String> expected = new HashSet<>();
            for (JsonNode r : step.path("expect_refused")) {
                expected.add(r.path("id").asText() + "=" + code(r.path("code")).value());
            }
            assertEquals(expected, refused, "refused (id=code)");
        } else {
            List<String> ids = instances.stream()
                    .map(i -> i.getId().isEmpty() ? i.getHost() + ":" + i.getPort() : i.getId()).toList();
            assertEquals(ids, accepted, "every instance accepted");
            assertEquals(Set.of(), refused, "nothing refused");
        }
    }

    private static void pickSequence(JsonNode step, List<RotaClient> clients) {
        List<Integer> order = new ArrayList<>();
        for (JsonNode c : step.path("connections")) {
            order.add(c.asInt());
        }
        if (order.isEmpty()) {
            order.add(0);
        }
        PickRequest request = request(step.path("request"));
        int count = step.path("count").asInt();
        List<String> ids = new ArrayList<>();
        List<String> fallbacks = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            Pick pick = clients.get(order.get(i % order.size())).pick(request);
            ids.add(pick.id());
            fallbacks.add(pick.fallback());
            assertFalse(pick.localFallback(), "answered by rota, not locally");
        }
        assertEquals(strings(step.path("expect_ids")), ids, "picked ids");
        if (step.has("expect_fallback")) {
            boolean expected = step.path("expect_fallback").asBoolean();
            for (int i = 0; i < count; i++) {
                assertEquals(expected, !fallbacks.get(i).isEmpty(), "fallback of pick " + i + ": \"" + fallbacks.get(i) + "\"");
            }
        }
    }

    private static void checkPick(RotaClient client, PickRequest request, JsonNode expect) {
        if (expect.has("error")) {
            RotaException e = Assertions.assertThrows(RotaException.class, () -> client.pick(request));
            assertEquals(expect.path("error").asText(), e.getCode().name(), "status code (" + e.getMessage() + ")");
            if (expect.has("message_contains")) {
                String part = expect.path("message_contains").asText();
                assertTrue(e.getDescription().contains(part), "message \"" + e.getDescription() + "\" contains \"" + part + "\"");
            }
            return;
        }
        Pick pick = client.pick(request);
        assertFalse(pick.localFallback(), "answered by rota, not locally");
        assertEquals(expect.path("id").asText(), pick.id(), "picked id");
        if (expect.has("fallback")) {
            assertEquals(expect.path("fallback").asBoolean(), pick.isFallback(), "fallback \"" + pick.fallback() + "\"");
        }
        if (expect.has("ticket")) {
            assertEquals(expect.path("ticket").asLong(), pick.ticket(), "ticket");
        }
    }

    static Instance instance(JsonNode node) {
        Instance.Builder b = Instance.newBuilder()
                .setId(node.path("id").asText(""))
                .setService(node.path("service").asText(""))
                .setHost(node.path("host").asText(""))
                .setPort(node.path("port").asInt(0))
                .setVersion(node.path("version").asText(""))
                .setZone(node.path("zone").asText(""));
        if (node.has("weight")) {
            b.setWeight(node.path("weight").asInt());
        }
        node.path("metadata").properties().forEach(e -> b.putMetadata(e.getKey(), e.getValue().asText()));
        if (node.has("status")) {
            b.setStatus(InstanceStatus.valueOf(node.path("status").asText()));
        }
        return b.build();
    }

    static PickRequest request(JsonNode node) {
        return PickRequest.newBuilder()
                .setService(node.path("service").asText(""))
                .setRule(node.path("rule").asText(""))
                .setVersion(node.path("version").asText(""))
                .setKey(node.path("key").asText(""))
                .setZone(node.path("zone").asText(""))
                .addAllExclude(strings(node.path("exclude")))
                .build();
    }

    private static Status.Code code(JsonNode node) {
        return node.isInt() ? Status.fromCodeValue(node.asInt()).getCode() : Status.Code.valueOf(node.asText());
    }

    private static List<String> strings(JsonNode array) {
        List<String> out = new ArrayList<>();
        for (JsonNode n : array) {
            out.add(n.asText());
        }
        return out;
    }
}
