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
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.extension.ExtendWith;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.grpc.Status;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;

/**
 * Runs every scenario of {@code clients/conformance/scenarios/} against the shared live server,
 * with the step semantics of {@code clients/conformance/README.md}. A key the README does not
 * define fails the scenario (a misspelt expectation would otherwise be skipped silently).
 */
@ExtendWith(SharedRotaServer.class)
class ConformanceTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final AtomicInteger FILES = new AtomicInteger(-1);
    private static final AtomicInteger PASSED = new AtomicInteger();

    private static final Set<String> SCENARIO_KEYS = Set.of("name", "connections", "steps");
    private static final Map<String, Set<String>> STEP_KEYS = Map.of(
            "register", Set.of("op", "stream", "instances", "expect_accepted", "expect_refused"),
            "withdraw", Set.of("op", "stream"),
            "pick", Set.of("op", "connection", "request", "expect"),
            "pick_sequence", Set.of("op", "connections", "request", "count", "expect_ids", "expect_fallback"),
            "list", Set.of("op", "service", "expect_ids"));
    private static final Set<String> REQUEST_KEYS = Set.of("service", "rule", "version", "key", "zone", "exclude");
    private static final Set<String> INSTANCE_KEYS = Set.of("service", "id", "host", "port", "version", "zone", "weight",
            "metadata", "status");
    private static final Set<String> EXPECT_KEYS = Set.of("id", "fallback", "ticket", "error", "message_contains");
    private static final Set<String> REFUSAL_KEYS = Set.of("id", "code");

    @TestFactory
    Stream<DynamicTest> scenarios(RotaServer rota) throws IOException {
        Path dir = RotaServer.repositoryRoot().resolve("clients/conformance/scenarios");
        List<Path> files;
        try (Stream<Path> listing = Files.list(dir)) {
            files = listing.filter(p -> p.getFileName().toString().endsWith(".json")).sorted().toList();
        }
        assertFalse(files.isEmpty(), "no scenarios in " + dir);
        FILES.set(files.size());
        return files.stream().map(file -> DynamicTest.dynamicTest(file.getFileName().toString(), file.toUri(),
                () -> {
                    Assertions.assertTimeoutPreemptively(Duration.ofSeconds(60),
                            () -> run(rota, JSON.readTree(file.toFile())));
                    PASSED.incrementAndGet();
                }));
    }

    /** Every scenario file ran and passed: a run that skipped some (or all) of them fails. */
    @AfterAll
    static void everyScenarioRan() {
        assertEquals(FILES.get(), PASSED.get(), "scenarios passed of the files found");
    }

    @Test
    void aWrongExpectationFailsTheScenario(RotaServer rota) throws IOException {
        String scenario = """
                { "name": "runner self-check", "steps": [
                  { "op": "register", "stream": "p", "instances": [
                    { "service": "conf-selfcheck", "id": "a", "host": "127.0.0.1", "port": 7001 } ] },
                  { "op": "pick", "request": { "service": "conf-selfcheck", "rule": "round_robin" },
                    "expect": { "id": "b" } } ] }
                """;
        AssertionError wrong = Assertions.assertThrows(AssertionError.class, () -> run(rota, JSON.readTree(scenario)));
        assertTrue(wrong.getMessage().contains("step 1 (pick)"), wrong.getMessage());
        assertTrue(wrong.getMessage().contains("picked id"), wrong.getMessage());
    }

    @Test
    void anUnknownKeyFailsTheScenario(RotaServer rota) throws IOException {
        String misspelt = """
                { "name": "runner self-check", "steps": [
                  { "op": "pick", "request": { "service": "conf-selfcheck-2" },
                    "expect": { "eror": "NOT_FOUND" } } ] }
                """;
        AssertionError e = Assertions.assertThrows(AssertionError.class, () -> run(rota, JSON.readTree(misspelt)));
        assertTrue(e.getMessage().contains("\"eror\""), e.getMessage());
        String topLevel = "{ \"name\": \"x\", \"conections\": 2, \"steps\": [] }";
        AssertionError top = Assertions.assertThrows(AssertionError.class, () -> run(rota, JSON.readTree(topLevel)));
        assertTrue(top.getMessage().contains("\"conections\""), top.getMessage());
    }

    private static void checkKeys(String what, JsonNode node, Set<String> allowed) {
        if (node.isMissingNode() || node.isNull()) {
            return;
        }
        if (!node.isObject()) {
            fail(what + " is not an object: " + node);
        }
        for (String key : (Iterable<String>) node::fieldNames) {
            if (!allowed.contains(key)) {
                fail("unknown key \"" + key + "\" in " + what + " (known: " + new java.util.TreeSet<>(allowed) + ")");
            }
        }
    }

    private static void checkStep(JsonNode step) {
        String op = step.path("op").asText();
        Set<String> keys = STEP_KEYS.get(op);
        if (keys == null) {
            fail("unknown op \"" + op + "\"");
        }
        checkKeys("step", step, keys);
        checkKeys("request", step.path("request"), REQUEST_KEYS);
        checkKeys("expect", step.path("expect"), EXPECT_KEYS);
        for (JsonNode instance : step.path("instances")) {
            checkKeys("instance", instance, INSTANCE_KEYS);
        }
        for (JsonNode refusal : step.path("expect_refused")) {
            checkKeys("expect_refused entry", refusal, REFUSAL_KEYS);
        }
    }

    static void run(RotaServer rota, JsonNode scenario) {
        checkKeys("scenario", scenario, SCENARIO_KEYS);
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
                    checkStep(step);
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
                checkPick(client, PickStep.of(step.path("request")), step.path("expect"));
            }
            case "pick_sequence" -> pickSequence(step, clients);
            case "list" -> {
                List<String> ids = clients.get(0).listInstances(step.path("service").asText()).ids();
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
            // Refusals are part of what a step checks, so they must not throw here.
            Registration registration = provider.registerAllowingPartial(instances);
            streams.put(name, registration);
            ack = registration.ack();
        } else {
            ack = open.announce(instances);
        }
        List<String> accepted = ack.acceptedIds();
        Set<String> refused = new HashSet<>();
        for (Refusal refusal : ack.refused()) {
            refused.add(refusal.instance().id() + "=" + refusal.code().value());
        }
        if (step.has("expect_accepted") || step.has("expect_refused")) {
            assertEquals(strings(step.path("expect_accepted")), accepted, "accepted ids");
            Set<String> expected = new HashSet<>();
            for (JsonNode r : step.path("expect_refused")) {
                expected.add(r.path("id").asText() + "=" + code(r.path("code")).value());
            }
            assertEquals(expected, refused, "refused (id=code)");
        } else {
            List<String> ids = instances.stream().map(i -> i.ref().id()).toList();
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
        PickStep request = PickStep.of(step.path("request"));
        int count = step.path("count").asInt();
        List<String> ids = new ArrayList<>();
        List<String> fallbacks = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            Pick pick = request.run(clients.get(order.get(i % order.size())));
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

    private static void checkPick(RotaClient client, PickStep request, JsonNode expect) {
        if (expect.has("error")) {
            RotaException e = Assertions.assertThrows(RotaException.class, () -> request.run(client));
            assertEquals(expect.path("error").asText(), e.getCode().name(), "status code (" + e.getMessage() + ")");
            if (expect.has("message_contains")) {
                String part = expect.path("message_contains").asText();
                assertTrue(e.getDescription().contains(part), "message \"" + e.getDescription() + "\" contains \"" + part + "\"");
            }
            return;
        }
        Pick pick = request.run(client);
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
        Map<String, String> metadata = new LinkedHashMap<>();
        node.path("metadata").properties().forEach(e -> metadata.put(e.getKey(), e.getValue().asText()));
        Instance instance = Instance.of(node.path("service").asText(""), node.path("host").asText(""),
                node.path("port").asInt(0))
                .withId(node.path("id").asText(""))
                .withVersion(node.path("version").asText(""))
                .withZone(node.path("zone").asText(""))
                .withMetadata(metadata);
        if (node.has("weight")) {
            instance = instance.withWeight(node.path("weight").asInt());
        }
        if (node.has("status")) {
            instance = instance.withStatus(InstanceStatus.valueOf(node.path("status").asText()));
        }
        return instance;
    }

    /** A step's pick request: fields left out take their proto defaults (no version, not the current one). */
    record PickStep(String service, PickOptions options) {
        static PickStep of(JsonNode node) {
            return new PickStep(node.path("service").asText(""), PickOptions.builder()
                    .rule(node.path("rule").asText(""))
                    .version(node.path("version").asText(""))
                    .key(node.path("key").asText(""))
                    .zone(node.path("zone").asText(""))
                    .exclude(strings(node.path("exclude")))
                    .build());
        }

        Pick run(RotaClient client) {
            return client.pick(service, options);
        }
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
