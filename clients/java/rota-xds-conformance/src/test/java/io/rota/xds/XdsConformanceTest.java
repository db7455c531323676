package io.rota.xds;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.Timeout;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.rota.client.Backoff;
import io.rota.client.Instance;
import io.rota.client.InstanceRef;
import io.rota.client.InstanceStatus;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.RotaException;
import io.rota.client.Update;
import io.rota.client.channel.CallsAfterChange;
import io.rota.client.channel.EchoFleet;
import io.rota.client.testing.Await;
import io.rota.client.testing.RotaServer;

/**
 * The xDS scenarios (clients/conformance/xds/*.json; README there and in ../channel) played by
 * grpc-java's own xDS client: rota serves ADS on its gRPC port, and the consumer is a channel to
 * {@code xds:///echo} built by {@code io.grpc:grpc-xds} in a process of its own
 * ({@link XdsConsumer}), from a bootstrap file written for each rota started here. rota, the
 * echo servers and the registrations are this JVM's, with the harness of the channel scenarios
 * (rota-client's test-jar: {@link RotaServer}, {@link EchoFleet}). The consumers' logs (grpc-xds
 * at FINER; {@code -Drota.xds.debug=true} for every resource) are in
 * {@code target/xds-logs/SCENARIO.log}, rota's in {@code target/rota-logs/}.
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class XdsConformanceTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    /**
     * Scenarios that fail because of rota's xDS server, not this runner: file name, and the reason
     * in one line. They are reported as skipped.
     */
    static final Map<String, String> SKIP = Map.of();

    /** rota's warm-up after {@code restart_rota}: at least 10 s (the README); rota's default, its heartbeat timeout. */
    static final String RESTART_WARMUP = "15s";

    /** The longest a scenario may take, every step included. */
    private static final Duration SCENARIO_BOUND = Duration.ofSeconds(120);

    @TestFactory
    Stream<DynamicTest> scenarios() throws IOException {
        Path dir = RotaServer.repositoryRoot().resolve("clients/conformance/xds");
        List<Path> files;
        try (Stream<Path> listing = Files.list(dir)) {
            files = listing.filter(p -> p.toString().endsWith(".json")).sorted().toList();
        }
        assertTrue(!files.isEmpty(), "no scenario in " + dir);
        return files.stream().map(file -> DynamicTest.dynamicTest(file.getFileName().toString(), () -> {
            JsonNode scenario = JSON.readTree(file.toFile());
            checkKeys(scenario);
            String name = file.getFileName().toString();
            String skip = SKIP.get(name);
            Assumptions.assumeTrue(skip == null, () -> "skipped: " + skip);
            String stem = name.substring(0, name.length() - ".json".length());
            try (Runner runner = new Runner(scenario, stem)) {
                try {
                    for (JsonNode step : scenario.get("steps")) {
                        runner.step(step);
                    }
                } catch (AssertionError | RuntimeException e) {
                    throw new AssertionError(e.getMessage() + runner.diagnostics(), e);
                }
            }
        }));
    }

    // --- the format -------------------------------------------------------------------------------

    /** The keys the channel format and clients/conformance/xds/README.md define; any other fails the scenario. */
    private static final Set<String> SCENARIO_KEYS = Set.of("name", "service", "instances", "policy", "rota_policy", "steps");
    private static final Set<String> INSTANCE_KEYS = Set.of("id", "version", "weight", "unreachable");
    private static final Map<String, Set<String>> STEP_KEYS = Map.of(
            "calls", Set.of("calls", "consumers", "version", "deadline_ms", "keys", "expect"),
            "withdraw", Set.of("withdraw", "within_ms", "version"),
            "drain", Set.of("drain", "within_ms", "version"),
            "trip", Set.of("trip", "within_ms", "version"),
            "kill", Set.of("kill"),
            "hang", Set.of("hang"),
            "stop_rota", Set.of("stop_rota"),
            "restart_rota", Set.of("restart_rota"));
    /**
     * {@code leased}, {@code rotation} and {@code runs} need tickets, which xDS calls do not carry;
     * with {@code "rota_policy": true} they carry rota's, and {@code rotation} checks them.
     */
    private static final Set<String> EXPECT_KEYS = Set.of("failures", "error_contains", "codes", "only", "never", "spread",
            "counts", "balanced", "keyed");
    private static final Set<String> ROTA_POLICY_EXPECT_KEYS = union(EXPECT_KEYS, Set.of("rotation"));

    private static Set<String> union(Set<String> a, Set<String> b) {
        Set<String> out = new java.util.HashSet<>(a);
        out.addAll(b);
        return Set.copyOf(out);
    }

    /** Whether the scenario's consumers register rota's own policy (gRFC A52), {@code "rota_policy": true}. */
    static boolean rotaPolicy(JsonNode scenario) {
        JsonNode flag = scenario.path("rota_policy");
        assertTrue(flag.isMissingNode() || flag.isBoolean(), "rota_policy must be true or false: " + flag);
        return flag.asBoolean(false);
    }

    private static void known(JsonNode node, Set<String> known, String where) {
        node.fieldNames().forEachRemaining(key -> assertTrue(known.contains(key), "unknown key \"" + key + "\" in " + where));
    }

    /** Every key of a scenario, its instances, steps and expectations is one the format defines. */
    static void checkKeys(JsonNode scenario) {
        known(scenario, SCENARIO_KEYS, "the scenario");
        Set<String> expectKeys = rotaPolicy(scenario) ? ROTA_POLICY_EXPECT_KEYS : EXPECT_KEYS;
        scenario.path("instances").forEach(i -> known(i, INSTANCE_KEYS, "an instance"));
        for (JsonNode step : scenario.path("steps")) {
            String action = STEP_KEYS.keySet().stream().filter(step::has).findFirst()
                    .orElseThrow(() -> new AssertionError("a step with no action: " + step));
            known(step, STEP_KEYS.get(action), "a " + action + " step");
            if (step.has("expect")) {
                known(step.get("expect"), expectKeys, "an expectation");
            }
            if (step.has("keys")) {
                assertTrue(step.get("keys").isInt() && step.get("keys").asInt() >= 1, "keys must be a count of at least 1: " + step);
            }
            JsonNode keyed = step.path("expect").path("keyed");
            if (!keyed.isMissingNode()) {
                assertTrue(keyed.isBoolean() && keyed.asBoolean(), "keyed can only be true: " + step);
                assertTrue(step.has("keys"), "a step that expects keyed calls sends no keys: " + step);
            }
        }
    }

    @Test
    void aMisspeltKeyFailsTheScenario() throws IOException {
        checkKeys(JSON.readTree("{\"rota_policy\": true, \"steps\": [{\"calls\": 1, \"expect\": {\"rotation\": [\"a\"]}}]}"));
        checkKeys(JSON.readTree("{\"name\": \"n\", \"instances\": [{\"id\": \"a\"}], \"policy\": {}, \"steps\": ["
                + "{\"drain\": \"a\", \"within_ms\": 5, \"version\": \"v\"}, {\"trip\": \"a\", \"within_ms\": 5},"
                + "{\"calls\": 1, \"expect\": {\"codes\": [\"UNAVAILABLE\"], \"only\": [\"a\"]}},"
                + "{\"calls\": 4, \"keys\": 2, \"expect\": {\"keyed\": true}}]}"));
        for (String bad : List.of(
                "{\"rule\": \"round_robin\", \"steps\": []}",
                "{\"instances\": [{\"id\": \"a\", \"zone\": \"z\"}], \"steps\": []}",
                "{\"steps\": [{\"calls\": 1, \"expect\": {\"code\": []}}]}",
                "{\"steps\": [{\"calls\": 1, \"expect\": {\"rotation\": [\"a\"]}}]}",
                "{\"steps\": [{\"drain\": \"a\", \"within\": 5}]}",
                "{\"steps\": [{\"await_leases\": true, \"within_ms\": 5}]}",
                "{\"rota_policy\": false, \"steps\": [{\"calls\": 1, \"expect\": {\"rotation\": [\"a\"]}}]}",
                "{\"rota_policy\": \"yes\", \"steps\": []}",
                "{\"rota_policy\": true, \"steps\": [{\"calls\": 1, \"expect\": {\"runs\": 3}}]}",
                "{\"rota_policy\": true, \"steps\": [{\"calls\": 1, \"expect\": {\"leased\": true}}]}",
                "{\"rota_policy\": true, \"rule\": \"round_robin\", \"steps\": []}",
                "{\"steps\": [{\"calls\": 1, \"key\": 2}]}",
                "{\"steps\": [{\"calls\": 1, \"keys\": 0}]}",
                "{\"steps\": [{\"calls\": 1, \"keys\": \"2\"}]}",
                "{\"steps\": [{\"withdraw\": \"a\", \"within_ms\": 5, \"keys\": 2}]}",
                "{\"steps\": [{\"calls\": 1, \"expect\": {\"keyed\": true}}]}",
                "{\"steps\": [{\"calls\": 1, \"keys\": 2, \"expect\": {\"keyed\": false}}]}")) {
            JsonNode scenario = JSON.readTree(bad);
            assertThrows(AssertionError.class, () -> checkKeys(scenario), bad);
        }
    }

    @Test
    void rotationFailsWhenTheTicketsDoNotFollowIt() {
        JsonNode three = JSON.createArrayNode().add("c").add("a").add("b");
        List<EchoFleet.Received> good = List.of(new EchoFleet.Received("a", "3", 0, false),
                new EchoFleet.Received("c", "5", 0, false), new EchoFleet.Received("b", "4", 0, false));
        checkRotation(three, "round_robin", good, new java.util.HashSet<>());
        checkRotation(three, "repeat(n=2)", List.of(new EchoFleet.Received("b", "3", 0, false)), new java.util.HashSet<>());
        for (List<EchoFleet.Received> bad : List.of(
                List.of(new EchoFleet.Received("b", "3", 0, false)),
                List.of(new EchoFleet.Received("a", null, 0, false)),
                List.of(new EchoFleet.Received("a", "L3", 0, false)),
                List.of(new EchoFleet.Received("a", "3", 0, false), new EchoFleet.Received("a", "3", 0, false)))) {
            assertThrows(AssertionError.class, () -> checkRotation(three, "round_robin", bad, new java.util.HashSet<>()), bad::toString);
        }
        assertThrows(AssertionError.class, () -> checkRotation(three, "round_robin", List.of(), new java.util.HashSet<>()));
        assertThrows(AssertionError.class, () -> checkRotation(three, "weighted", good, new java.util.HashSet<>()));
        // Across steps: a ticket seen before is a ticket used twice.
        Set<Long> seen = new java.util.HashSet<>(Set.of(3L));
        assertThrows(AssertionError.class, () -> checkRotation(three, "round_robin", good, seen));
    }

    @Test
    void expectationsFailWhenTheyDoNotHold() {
        List<EchoFleet.Received> two = List.of(new EchoFleet.Received("a", null, 0, false),
                new EchoFleet.Received("b", null, 0, false));
        ObjectNode expect = JSON.createObjectNode();
        expect.putArray("only").add("a").add("b");
        expect.put("spread", true);
        expect.put("failures", 1);
        expect.putArray("codes").add("UNAVAILABLE");
        check(expect, two, List.of(new Failure("UNAVAILABLE", "no healthy upstream")));
        assertThrows(AssertionError.class, () -> check(expect, two, List.of(new Failure("DEADLINE_EXCEEDED", "late"))));
        assertThrows(AssertionError.class, () -> check(expect, two.subList(0, 1), List.of(new Failure("UNAVAILABLE", "x"))));
        ObjectNode never = JSON.createObjectNode();
        never.putArray("never").add("b");
        assertThrows(AssertionError.class, () -> check(never, two, List.of()));
    }

    @Test
    void keyedFailsWhenAKeyReachesTwoInstances() {
        checkKeyed(List.of(new Keyed("key-0", "a"), new Keyed("key-1", "b"), new Keyed("key-0", "a")));
        AssertionError split = assertThrows(AssertionError.class,
                () -> checkKeyed(List.of(new Keyed("key-0", "a"), new Keyed("key-1", "b"), new Keyed("key-0", "b"))));
        assertTrue(split.getMessage().contains("1 of 2 keys reached more than one instance: key-0 reached {a=1, b=1}"), split.getMessage());
        // Round robin over three instances with two keys: both keys reach several.
        List<Keyed> roundRobin = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            roundRobin.add(new Keyed(XdsConsumer.keyName(i, 2), List.of("a", "b", "c").get(i % 3)));
        }
        assertThrows(AssertionError.class, () -> checkKeyed(roundRobin));
        assertThrows(AssertionError.class, () -> checkKeyed(List.of(new Keyed(null, "a"))));
        assertThrows(AssertionError.class, () -> checkKeyed(List.of()));
        assertEquals("key-1", XdsConsumer.keyName(7, 3));
        assertNull(XdsConsumer.keyName(7, 0));
    }

    /** Without a hashing rule rota's clusters name round_robin, which takes no notice of the key: keyed fails. */
    @Test
    void keyedFailsUnderRoundRobin() throws Exception {
        // 7 keys share no factor with the 3 (or, while one connection is on its way, 2) instances rotated over.
        JsonNode scenario = JSON.readTree("{\"name\": \"round robin on purpose\", \"instances\": [{\"id\": \"echo-a\"},"
                + "{\"id\": \"echo-b\"}, {\"id\": \"echo-c\"}], \"steps\": ["
                + "{\"calls\": 30, \"keys\": 10, \"expect\": {\"failures\": 0}},"
                + "{\"calls\": 49, \"keys\": 7, \"expect\": {\"failures\": 0, \"keyed\": true}}]}");
        checkKeys(scenario);
        try (Runner runner = new Runner(scenario, "keyed-round-robin")) {
            runner.step(scenario.get("steps").get(0));
            AssertionError failed = assertThrows(AssertionError.class, () -> runner.step(scenario.get("steps").get(1)));
            assertTrue(failed.getMessage().matches("(?s)keyed: \\d+ of 7 keys reached more than one instance.*"), failed.getMessage());
        }
    }

    // --- the expectations ---------------------------------------------------------------------------

    /** An answered call and the {@code x-rota-key} it sent (null for none). */
    record Keyed(String key, String instance) {
    }

    /**
     * {@code keyed}: every answered call carried a key, and all answered calls with the same key
     * (over every consumer of the step) reached one instance.
     */
    static void checkKeyed(List<Keyed> answered) {
        assertTrue(!answered.isEmpty(), "keyed: no call was answered");
        Map<String, Map<String, Integer>> byKey = new TreeMap<>();
        for (Keyed k : answered) {
            assertTrue(k.key() != null, "keyed: a call to " + k.instance() + " carried no key");
            byKey.computeIfAbsent(k.key(), key -> new TreeMap<>()).merge(k.instance(), 1, Integer::sum);
        }
        List<String> split = new ArrayList<>();
        byKey.forEach((key, reached) -> {
            if (reached.size() > 1) {
                split.add(key + " reached " + reached);
            }
        });
        assertTrue(split.isEmpty(), "keyed: " + split.size() + " of " + byKey.size() + " keys reached more than one instance: "
                + String.join("; ", split.subList(0, Math.min(5, split.size()))));
    }

    /** A failed call as its consumer saw it. */
    record Failure(String code, String description) {
        @Override
        public String toString() {
            return code + ": " + description;
        }
    }

    static void check(JsonNode expect, List<EchoFleet.Received> received, List<Failure> failures) {
        String shown = failures.size() > 3 ? failures.subList(0, 3) + " and " + (failures.size() - 3) + " more" : failures.toString();
        if (expect.has("failures")) {
            assertEquals(expect.get("failures").asInt(), failures.size(), "failed calls: " + shown);
        }
        if (expect.has("error_contains")) {
            String text = expect.get("error_contains").asText();
            assertTrue(failures.stream().allMatch(f -> f.description().contains(text)), "error_contains " + text + ": " + shown);
        }
        if (expect.has("codes")) {
            List<String> codes = strings(expect.get("codes"));
            assertTrue(failures.stream().allMatch(f -> codes.contains(f.code())), "codes " + codes + ": " + shown);
        }
        Map<String, Integer> got = new TreeMap<>();
        received.forEach(r -> got.merge(r.instance(), 1, Integer::sum));
        if (expect.has("only")) {
            assertTrue(strings(expect.get("only")).containsAll(got.keySet()), "only " + expect.get("only") + ", reached " + got);
        }
        if (expect.has("never")) {
            assertTrue(strings(expect.get("never")).stream().noneMatch(got::containsKey), "never " + expect.get("never") + ", reached " + got);
        }
        if (expect.path("spread").asBoolean()) {
            assertEquals(new TreeSet<>(strings(expect.get("only"))), got.keySet(), "spread over " + expect.get("only"));
        }
        if (expect.path("balanced").asBoolean()) {
            // Over the answered calls (a hung server answers none) of the ids in `only`.
            Map<String, Integer> answered = new TreeMap<>();
            if (expect.has("only")) {
                strings(expect.get("only")).forEach(id -> answered.put(id, 0));
            }
            int total = 0;
            for (EchoFleet.Received r : received) {
                if (!r.hung()) {
                    answered.merge(r.instance(), 1, Integer::sum);
                    total++;
                }
            }
            assertTrue(!answered.isEmpty(), "balanced: no instance answered");
            int most = Collections.max(answered.values());
            int fewest = Collections.min(answered.values());
            assertTrue(fewest > 0, "not every instance answered: " + answered);
            assertTrue(most - fewest <= Math.max(2, total / 10), "unbalanced over " + total + " answered calls: " + answered);
        }
        if (expect.has("counts")) {
            Map<String, Integer> wanted = new TreeMap<>();
            JsonNode counts = expect.get("counts");
            counts.fieldNames().forEachRemaining(id -> {
                if (counts.get(id).asInt() != 0) {
                    wanted.put(id, counts.get(id).asInt());
                }
            });
            assertEquals(wanted, got, "calls per instance");
        }
    }

    /**
     * {@code rotation}: every call carried a leased ticket ({@code x-rota-ticket}, a number; a
     * local pick's {@code L<n>} is none), no ticket came twice ({@code seen}: the scenario's, across
     * every consumer), and each call reached the instance {@code rule} maps its ticket to over
     * {@code ids} in id order. Only {@code round_robin} and {@code repeat(n=N)}: a {@code weighted}
     * rotation's schedule is the client's own (package-private) mapping, and no xDS scenario has one.
     */
    static void checkRotation(JsonNode expected, String rule, List<EchoFleet.Received> received, Set<Long> seen) {
        List<String> ids = new ArrayList<>(new TreeSet<>(strings(expected)));
        java.util.regex.Matcher repeat = java.util.regex.Pattern.compile("repeat(?:\\(n=(\\d+)\\))?").matcher(rule);
        long run = rule.equals("round_robin") ? 1 : repeat.matches() ? (repeat.group(1) == null ? 3 : Long.parseLong(repeat.group(1))) : 0;
        assertTrue(run > 0, "rotation: the runner maps round_robin and repeat(n=N) only, not " + rule);
        assertTrue(!received.isEmpty(), "rotation: no call was answered");
        for (EchoFleet.Received r : received) {
            assertTrue(r.ticket() != null && !r.ticket().startsWith("L"), "call to " + r.instance()
                    + " without a leased ticket (x-rota-ticket " + r.ticket() + ")");
            long ticket = Long.parseUnsignedLong(r.ticket());
            assertTrue(seen.add(ticket), "ticket " + r.ticket() + " used twice");
            String wanted = ids.get((int) Long.remainderUnsigned(Long.divideUnsigned(ticket, run), ids.size()));
            assertEquals(wanted, r.instance(), "ticket " + r.ticket() + " (" + rule + " over " + ids + ")");
        }
    }

    private static List<String> strings(JsonNode array) {
        List<String> out = new ArrayList<>();
        array.forEach(n -> out.add(n.asText()));
        return out;
    }

    // --- a scenario ---------------------------------------------------------------------------------

    /** A line of a consumer's log worth showing when a scenario fails. */
    private static final java.util.regex.Pattern COMPLAINT = java.util.regex.Pattern.compile(
            "(?i)nack|error|fail|warn|invalid|unavailable|exception|does not exist|not found|reject");

    private static final class Runner implements AutoCloseable {
        final JsonNode scenario;
        final String stem;
        final String service;
        final long deadline = System.nanoTime() + SCENARIO_BOUND.toNanos();
        final EchoFleet fleet = new EchoFleet();
        final Map<String, Registration> registrations = new HashMap<>();
        final Path logs = Paths.get(System.getProperty("user.dir"), "target", "xds-logs");
        final List<Consumer> consumers = new ArrayList<>();
        /** Whether consumers register rota's own policy, pointing at this scenario's rota. */
        final boolean rotaPolicy;
        /** The rule rota's policy names (the scenario's policy's, else rota's default), for {@code rotation}. */
        final String rule;
        /** Every leased ticket a call carried so far, over all consumers and steps. */
        final Set<Long> seen = new java.util.HashSet<>();
        RotaServer rota;
        RotaClient provider;
        Path bootstrap;
        Consumer consumer;

        Runner(JsonNode scenario, String stem) throws Exception {
            this.scenario = scenario;
            this.stem = stem;
            this.service = scenario.path("service").asText("echo");
            this.rotaPolicy = rotaPolicy(scenario);
            this.rule = scenario.path("policy").path("rule").asText("round_robin");
            rota = RotaServer.start();
            provider = RotaClient.builder().target(rota.target())
                    .backoff(Backoff.exponential(Duration.ofMillis(20), Duration.ofMillis(500))).build();
            for (JsonNode spec : scenario.get("instances")) {
                String id = spec.get("id").asText();
                // An unreachable instance is registered at a loopback port where nothing listens.
                int port = spec.path("unreachable").asBoolean() ? EchoFleet.unreachablePort() : fleet.start(id);
                Instance instance = Instance.of("echo", "127.0.0.1", port).withId(id)
                        .withVersion(spec.path("version").asText(""));
                if (spec.has("weight")) {
                    instance = instance.withWeight(spec.get("weight").asInt());
                }
                registrations.put(id, provider.register(instance));
            }
            if (scenario.has("policy")) {
                // Proto JSON of a rota.v1.Policy without its service, set before the channel opens.
                io.rota.v1.Policy.Builder policy = io.rota.v1.Policy.newBuilder();
                com.google.protobuf.util.JsonFormat.parser().merge(JSON.writeValueAsString(scenario.get("policy")), policy);
                io.rota.v1.PoliciesGrpc.newBlockingStub(provider.channel()).withDeadlineAfter(10, TimeUnit.SECONDS)
                        .setPolicy(io.rota.v1.SetPolicyRequest.newBuilder().setPolicy(policy.setService(service)).build());
            }
            bootstrap = writeBootstrap(rota.port());
            Files.createDirectories(logs);
            consumer = startConsumer(stem);
        }

        /** The bootstrap naming this scenario's rota and nothing else (clients/conformance/xds/README.md). */
        private static Path writeBootstrap(int port) throws IOException {
            ObjectNode root = JSON.createObjectNode();
            ObjectNode server = root.putArray("xds_servers").addObject();
            server.put("server_uri", "127.0.0.1:" + port);
            server.putArray("channel_creds").addObject().put("type", "insecure");
            server.putArray("server_features").add("xds_v3");
            ObjectNode node = root.putObject("node");
            node.put("id", "conformance-java");
            node.putObject("locality");
            Path file = Files.createTempFile("rota-xds-bootstrap-", ".json");
            Files.writeString(file, JSON.writeValueAsString(root));
            return file;
        }

        private Consumer startConsumer(String logName) throws IOException, InterruptedException {
            Consumer started = new Consumer(bootstrap, "xds:///" + service, rotaPolicy ? rota.target() : null,
                    logs.resolve(logName + ".log"), deadline);
            consumers.add(started);
            started.awaitReady();
            return started;
        }

        void step(JsonNode step) throws Exception {
            String version = step.path("version").asText("");
            if (step.has("calls")) {
                calls(step);
            } else if (step.has("withdraw")) {
                String id = step.get("withdraw").asText();
                registrations.remove(id).close();
                callsAfter(id, System.nanoTime(), step, version, "its withdrawal");
            } else if (step.has("drain")) {
                String id = step.get("drain").asText();
                Registration registration = registrations.get(id);
                // update returns once rota has acknowledged the DRAINING status.
                registration.update(Update.of(new InstanceRef("echo", id)).withStatus(InstanceStatus.DRAINING));
                callsAfter(id, System.nanoTime(), step, version, "the acknowledgement of its DRAINING");
            } else if (step.has("trip")) {
                String id = step.get("trip").asText();
                int threshold = trip(id);
                callsAfter(id, System.nanoTime(), step, version, "the report of " + threshold + " failed calls");
            } else if (step.has("kill")) {
                fleet.kill(step.get("kill").asText());
                // A call already on its way to the dead instance may fail; as many calls in a row
                // as there are instances then get through (clients/conformance/channel/README.md).
                int want = scenario.get("instances").size();
                Consumer.Result result = consumer.run("streak " + want + " " + 10 * want + " 5000", 10L * want * 6000);
                int inARow = 0;
                for (String answer : result.answers()) {
                    inARow = answer.startsWith("OK ") ? inARow + 1 : 0;
                }
                assertEquals(want, Math.min(inARow, want), want + " calls in a row did not get through after the kill");
            } else if (step.has("hang")) {
                fleet.hang(step.get("hang").asText());
            } else if (step.path("stop_rota").asBoolean()) {
                rota.kill();
            } else if (step.path("restart_rota").asBoolean()) {
                // With its warm-up on (rota's default, the heartbeat timeout: 15 s), which the runner's
                // harness turns off: a restarted rota withholds the service until its providers are
                // back rather than telling the xDS clients it has none (clients/conformance/xds/README.md).
                rota = RotaServer.startOn(rota.target(), "--warmup", RESTART_WARMUP);
                // Over when rota lists again every instance whose registration is open.
                Set<String> open = new TreeSet<>(registrations.keySet());
                Await.until("rota to list " + open + " after its restart", Duration.ofSeconds(20), () -> {
                    Set<String> listed = new TreeSet<>();
                    try {
                        provider.listInstances("echo").instances().forEach(i -> listed.add(i.id()));
                    } catch (RotaException e) {
                        return false; // not answering yet
                    }
                    return listed.containsAll(open);
                });
            } else {
                throw new AssertionError("unknown step " + step);
            }
        }

        /**
         * Reports as many failed calls of the instance as the service's breaker threshold, as a
         * channel's leased calls (clients/conformance/xds/README.md, {@code trip}); returns that threshold.
         */
        private int trip(String id) {
            io.rota.v1.Policy policy = io.rota.v1.PoliciesGrpc.newBlockingStub(provider.channel())
                    .withDeadlineAfter(10, TimeUnit.SECONDS)
                    .getPolicy(io.rota.v1.GetPolicyRequest.newBuilder().setService(service).build());
            int threshold = policy.getBreaker().getFailureThreshold() == 0 ? 3 : policy.getBreaker().getFailureThreshold();
            io.rota.v1.ReportRequest.Builder report = io.rota.v1.ReportRequest.newBuilder();
            for (int i = 0; i < threshold; i++) {
                report.addOutcomes(io.rota.v1.CallOutcome.newBuilder().setService("echo").setInstanceId(id)
                        .setLatencyUs(1000).setResult(io.rota.v1.CallResult.CALL_RESULT_ERROR).setLeased(true));
            }
            io.rota.v1.ReportResponse response = io.rota.v1.BalancerGrpc.newBlockingStub(provider.channel())
                    .withDeadlineAfter(10, TimeUnit.SECONDS).report(report.build());
            assertEquals(threshold, response.getAccepted(), "outcomes of " + id + " accepted by rota: " + response);
            return threshold;
        }

        /**
         * The calls of withdraw, drain and trip through consumer 1, with the step's version:
         * {@link CallsAfterChange} (clients/conformance/xds/README.md). Each call is a command of
         * its own, timed here, so that its start and the receipts it caused are on one clock.
         */
        private void callsAfter(String id, long since, JsonNode step, String version, String what) throws Exception {
            String command = ("calls 1 5000 0 " + version).trim();
            long within = step.get("within_ms").asLong();
            List<Failure> failures = new ArrayList<>();
            List<CallsAfterChange.Made> made = CallsAfterChange.make(() -> {
                int before = fleet.received.size();
                failures.addAll(consumer.run(command, 6000).failures());
                List<EchoFleet.Received> all = List.copyOf(fleet.received);
                return all.subList(before, all.size()).stream().map(EchoFleet.Received::instance).toList();
            }, since, within, System::nanoTime);
            System.out.println(stem + ": " + id + ", after " + what + ": " + CallsAfterChange.summary(made, within) + "; "
                    + failures.size() + " failed" + (failures.isEmpty() ? "" : " (first: " + failures.get(0) + ")"));
            CallsAfterChange.check(made, id, within, what);
        }

        void calls(JsonNode step) throws Exception {
            int n = step.get("calls").asInt();
            String version = step.path("version").asText("");
            long deadlineMs = step.path("deadline_ms").asLong(5000);
            int keys = step.path("keys").asInt(0);
            String command = ("calls " + n + " " + deadlineMs + " " + keys + " " + version).trim();
            long bound = n * (deadlineMs + 1000);
            int before = fleet.received.size();
            // Consumers after the first: processes of their own, for this step only, at the same time.
            List<Consumer> others = new ArrayList<>();
            for (int c = 1; c < step.path("consumers").asInt(1); c++) {
                others.add(startConsumer(stem + "-consumer-" + (c + 1)));
            }
            for (Consumer other : others) {
                other.send(command);
            }
            List<Consumer.Result> results = new ArrayList<>(List.of(consumer.run(command, bound)));
            for (Consumer other : others) {
                results.add(other.collect(bound));
                other.close();
            }
            List<Failure> failures = new ArrayList<>();
            // Each answered call with the key it sent: call i of each consumer sent key-(i mod keys).
            List<Keyed> answered = new ArrayList<>();
            for (Consumer.Result result : results) {
                failures.addAll(result.failures());
                for (int i = 0; i < result.answers().size(); i++) {
                    String answer = result.answers().get(i);
                    if (answer.startsWith("OK ")) {
                        answered.add(new Keyed(XdsConsumer.keyName(i, keys), answer.substring("OK ".length())));
                    }
                }
            }
            List<EchoFleet.Received> all = List.copyOf(fleet.received);
            List<EchoFleet.Received> received = all.subList(before, all.size());
            Map<String, Integer> reached = new TreeMap<>();
            received.forEach(r -> reached.merge(r.instance() + (r.hung() ? " (hung)" : ""), 1, Integer::sum));
            System.out.println(stem + ": " + n + " calls" + (version.isEmpty() ? "" : " of version " + version) + ", "
                    + failures.size() + " failed" + (failures.isEmpty() ? "" : " (first: " + failures.get(0) + ")")
                    + ", reached " + reached);
            check(step.path("expect"), received, failures);
            if (step.path("expect").has("rotation")) {
                checkRotation(step.path("expect").get("rotation"), rule, received, seen);
            }
            if (step.path("expect").path("keyed").asBoolean()) {
                checkKeyed(answered);
            }
        }

        /** The consumers' complaints (NACKs, errors), the last 40 of each log, for the message of a failed scenario. */
        String diagnostics() {
            StringBuilder out = new StringBuilder();
            for (Consumer c : consumers) {
                out.append("\n--- ").append(c.log).append(", its last 40 lines of NACKs, errors and failures:\n");
                try (Stream<String> lines = Files.lines(c.log)) {
                    List<String> complaints = lines.filter(l -> COMPLAINT.matcher(l).find()).toList();
                    complaints.subList(Math.max(0, complaints.size() - 40), complaints.size())
                            .forEach(l -> out.append(l).append('\n'));
                } catch (IOException | RuntimeException e) {
                    out.append("(unreadable: ").append(e).append(")\n");
                }
            }
            out.append("--- rota's log: ").append(rota.log());
            return out.toString();
        }

        @Override
        public void close() throws Exception {
            for (Consumer c : consumers) {
                c.close();
            }
            provider.close();
            fleet.close();
            rota.close();
            Files.deleteIfExists(bootstrap);
        }
    }

    // --- a consumer process --------------------------------------------------------------------------

    /** One {@link XdsConsumer} process and the lines it answers. */
    private static final class Consumer implements AutoCloseable {
        private static final String EOF = "\u0000EOF";

        record Result(List<String> answers, List<Failure> failures) {
        }

        final Path log;
        private final Process process;
        private final Writer stdin;
        private final BlockingQueue<String> lines = new LinkedBlockingQueue<>();
        private final long scenarioDeadline;

        /** @param rotaPolicy rota's address for rota's own policy (registered with the ticket header), or null */
        Consumer(Path bootstrap, String target, String rotaPolicy, Path log, long scenarioDeadline) throws IOException {
            this.log = log;
            this.scenarioDeadline = scenarioDeadline;
            String java = ProcessHandle.current().info().command().orElse("java");
            List<String> command = new ArrayList<>(List.of(java, "-XX:TieredStopAtLevel=1", "-cp",
                    System.getProperty("java.class.path")));
            if (Boolean.getBoolean("rota.xds.debug")) {
                command.add("-Drota.xds.debug=true");
            }
            if (rotaPolicy != null) {
                command.add("-D" + XdsConsumer.ROTA_POLICY_PROPERTY + "=" + rotaPolicy);
            }
            command.addAll(List.of(XdsConsumer.class.getName(), target));
            ProcessBuilder builder = new ProcessBuilder(command).redirectError(log.toFile());
            builder.environment().remove("GRPC_XDS_BOOTSTRAP_CONFIG");
            builder.environment().put("GRPC_XDS_BOOTSTRAP", bootstrap.toString());
            process = builder.start();
            stdin = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
            Thread reader = new Thread(() -> {
                try (BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                    String line;
                    while ((line = out.readLine()) != null) {
                        lines.add(line);
                    }
                } catch (IOException gone) {
                    // the process is gone
                } finally {
                    lines.add(EOF);
                }
            }, "xds-consumer-stdout");
            reader.setDaemon(true);
            reader.start();
        }

        /** The next line, waiting until {@code until} (nanoTime), and never past the scenario's bound. */
        private String next(long until, String waitingFor) throws InterruptedException {
            long end = Math.min(until, scenarioDeadline);
            String line = lines.poll(Math.max(0, end - System.nanoTime()), TimeUnit.NANOSECONDS);
            if (line == null) {
                throw new AssertionError("the xDS consumer did not answer " + waitingFor + " in time"
                        + (end == scenarioDeadline ? " (the scenario's bound, " + SCENARIO_BOUND.toSeconds() + " s)" : ""));
            }
            if (line.equals(EOF)) {
                lines.add(EOF);
                throw new AssertionError("the xDS consumer exited (" + waitingFor + "); see " + log);
            }
            return line;
        }

        void awaitReady() throws InterruptedException {
            long started = System.nanoTime();
            String line = next(started + TimeUnit.SECONDS.toNanos(XdsConsumer.READY_SECONDS + 30), "READY");
            assertTrue(line.startsWith("READY "), "the xDS consumer said " + line);
            if (line.equals("READY READY") || line.equals("READY IDLE")) {
                System.out.println("xDS channel " + line.substring("READY ".length()) + " "
                        + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started)
                        + " ms after the consumer was started (its JVM included)");
            } else {
                // The calls will say why; the log has what the xDS client made of rota's answers.
                System.out.println("xDS channel not READY after " + XdsConsumer.READY_SECONDS + " s: " + line + "; see " + log);
            }
        }

        void send(String command) throws IOException {
            stdin.write(command + "\n");
            stdin.flush();
        }

        /** The answers to the command sent last, until its {@code DONE}. */
        Result collect(long boundMs) throws InterruptedException {
            long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(boundMs + 10_000);
            List<String> answers = new ArrayList<>();
            List<Failure> failures = new ArrayList<>();
            while (true) {
                String line = next(until, "its calls");
                if (line.startsWith("DONE ")) {
                    return new Result(answers, failures);
                }
                if (line.startsWith("FAILED ")) {
                    String[] parts = line.split(" ", 3);
                    failures.add(new Failure(parts[1], parts.length > 2 ? parts[2] : ""));
                } else if (!line.startsWith("OK ")) {
                    throw new AssertionError("the xDS consumer said " + line);
                }
                answers.add(line);
            }
        }

        Result run(String command, long boundMs) throws IOException, InterruptedException {
            send(command);
            return collect(boundMs);
        }

        @Override
        public void close() throws InterruptedException {
            if (process.isAlive()) {
                try {
                    send("quit");
                    stdin.close();
                } catch (IOException gone) {
                    // it exited
                }
                if (!process.waitFor(10, TimeUnit.SECONDS)) {
                    process.destroyForcibly();
                    process.waitFor(10, TimeUnit.SECONDS);
                }
            }
        }
    }
}
