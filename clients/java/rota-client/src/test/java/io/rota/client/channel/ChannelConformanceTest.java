package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.Timeout;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import io.rota.client.Backoff;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.testing.RotaServer;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * The shared channel scenarios (clients/conformance/channel/*.json, README there) through a
 * rota:/// channel; consumers after the first are separate JVMs ({@link EchoConsumer}).
 */
@Timeout(value = 240, unit = TimeUnit.SECONDS)
class ChannelConformanceTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    @TestFactory
    Stream<DynamicTest> scenarios() throws IOException {
        Path dir = RotaServer.repositoryRoot().resolve("clients/conformance/channel");
        List<Path> files;
        try (Stream<Path> listing = Files.list(dir)) {
            files = listing.filter(p -> p.toString().endsWith(".json")).sorted().toList();
        }
        return files.stream().map(file -> DynamicTest.dynamicTest(file.getFileName().toString(), () -> {
            JsonNode scenario = JSON.readTree(file.toFile());
            checkKeys(scenario);
            try (Runner runner = new Runner(scenario)) {
                for (JsonNode step : runner.scenario.get("steps")) {
                    runner.step(step);
                }
            }
        }));
    }

    /** The keys clients/conformance/channel/README.md defines; any other fails the scenario. */
    private static final Set<String> SCENARIO_KEYS = Set.of("name", "rule", "service", "instances", "policy", "steps");
    private static final Set<String> INSTANCE_KEYS = Set.of("id", "version", "weight", "unreachable");
    private static final Map<String, Set<String>> STEP_KEYS = Map.of(
            "calls", Set.of("calls", "consumers", "version", "deadline_ms", "expect"),
            "withdraw", Set.of("withdraw", "within_ms"),
            "kill", Set.of("kill"),
            "hang", Set.of("hang"),
            "stop_rota", Set.of("stop_rota"),
            "restart_rota", Set.of("restart_rota"),
            "await_leases", Set.of("await_leases", "within_ms"),
            "draw", Set.of("draw"));
    private static final Set<String> EXPECT_KEYS = Set.of("failures", "error_contains", "leased", "rotation", "runs", "only",
            "never", "spread", "counts", "balanced", "reported");

    /** Fails on a key of {@code node} outside {@code known}. */
    static void known(JsonNode node, Set<String> known, String where) {
        node.fieldNames().forEachRemaining(key -> assertTrue(known.contains(key), "unknown key \"" + key + "\" in " + where));
    }

    /** Every key of a scenario, its instances, steps and expectations is one the format defines. */
    static void checkKeys(JsonNode scenario) {
        known(scenario, SCENARIO_KEYS, "the scenario");
        scenario.path("instances").forEach(i -> known(i, INSTANCE_KEYS, "an instance"));
        for (JsonNode step : scenario.path("steps")) {
            String action = STEP_KEYS.keySet().stream().filter(step::has).findFirst()
                    .orElseThrow(() -> new AssertionError("a step with no action, keys " + step.properties().stream()
                            .map(e -> "\"" + e.getKey() + "\"").toList() + ": " + step));
            known(step, STEP_KEYS.get(action), "a " + action + " step");
            if (step.has("expect")) {
                known(step.get("expect"), EXPECT_KEYS, "an expectation");
            }
        }
    }

    @org.junit.jupiter.api.Test
    void aMisspeltKeyFailsTheScenario() throws IOException {
        JsonNode good = JSON.readTree("{\"name\": \"n\", \"rule\": \"round_robin\","
                + " \"instances\": [{\"id\": \"a\"}, {\"id\": \"b\", \"unreachable\": true}], \"policy\": {},"
                + " \"steps\": [{\"hang\": \"a\"}, {\"calls\": 1, \"expect\": {\"counts\": {\"a\": 1}, \"balanced\": true, \"reported\": true}}]}");
        checkKeys(good);
        for (String bad : List.of(
                "{\"rule\": \"round_robin\", \"polcy\": {}, \"steps\": []}",
                "{\"rule\": \"round_robin\", \"instances\": [{\"id\": \"a\", \"zone\": \"z\"}], \"steps\": []}",
                "{\"rule\": \"round_robin\", \"steps\": [{\"calls\": 1, \"expect\": {\"count\": {}}}]}",
                "{\"rule\": \"round_robin\", \"steps\": [{\"calls\": 1, \"versions\": \"v\"}]}",
                "{\"rule\": \"round_robin\", \"instances\": [{\"id\": \"a\", \"unreachble\": true}], \"steps\": []}",
                "{\"rule\": \"round_robin\", \"steps\": [{\"hang\": \"a\", \"within_ms\": 5}]}",
                "{\"rule\": \"round_robin\", \"steps\": [{\"calls\": 1, \"expect\": {\"balance\": true}}]}",
                "{\"rule\": \"round_robin\", \"steps\": [{\"calls\": 1, \"expect\": {\"report\": true}}]}",
                "{\"rule\": \"round_robin\", \"steps\": [{\"draw\": 7, \"within_ms\": 5}]}")) {
            JsonNode scenario = JSON.readTree(bad);
            org.junit.jupiter.api.Assertions.assertThrows(AssertionError.class, () -> checkKeys(scenario), bad);
        }
        checkKeys(JSON.readTree("{\"rule\": \"round_robin\", \"steps\": [{\"draw\": 7}]}"));
    }

    @org.junit.jupiter.api.Test
    void anUnknownKeyIsNamed() throws IOException {
        Map<String, String> named = Map.of(
                "{\"rule\": \"round_robin\", \"polcy\": {}, \"steps\": []}", "polcy",
                "{\"rule\": \"round_robin\", \"instances\": [{\"id\": \"a\", \"wieght\": 1}], \"steps\": []}", "wieght",
                "{\"rule\": \"round_robin\", \"steps\": [{\"draw\": 7, \"deadline_ms\": 1}]}", "deadline_ms",
                "{\"rule\": \"round_robin\", \"steps\": [{\"calls\": 1, \"expect\": {\"rotaton\": []}}]}", "rotaton");
        for (Map.Entry<String, String> e : named.entrySet()) {
            JsonNode scenario = JSON.readTree(e.getKey());
            AssertionError error = org.junit.jupiter.api.Assertions.assertThrows(AssertionError.class, () -> checkKeys(scenario));
            assertTrue(error.getMessage().contains("\"" + e.getValue() + "\""), error.getMessage());
        }
        // A step whose only key is misspelt has no action, and says which keys it has.
        JsonNode misspelt = JSON.readTree("{\"rule\": \"round_robin\", \"steps\": [{\"drwa\": 7}]}");
        AssertionError error = org.junit.jupiter.api.Assertions.assertThrows(AssertionError.class, () -> checkKeys(misspelt));
        assertTrue(error.getMessage().contains("drwa"), error.getMessage());
    }

    @org.junit.jupiter.api.Test
    void rotationRefusesTicketsDrawnOutOfBand() {
        // Tickets 7..12 after 7 drawn out of band follow round robin over three ids; ticket 5,
        // which a channel counting from 0 by itself would send, maps to its instance but was
        // drawn already.
        List<String> ids = List.of("a", "b", "c");
        Map<String, Integer> weights = Map.of("a", 100, "b", 100, "c", 100);
        List<EchoFleet.Received> calls = new ArrayList<>();
        for (long t = 7; t < 13; t++) {
            calls.add(new EchoFleet.Received(ids.get((int) (t % 3)), Long.toString(t), 0, false));
        }
        checkRotation("round_robin", ids, weights, calls, new HashSet<>(), 7);
        List<EchoFleet.Received> low = new ArrayList<>(calls);
        low.add(0, new EchoFleet.Received("c", "5", 0, false));
        AssertionError error = org.junit.jupiter.api.Assertions.assertThrows(AssertionError.class,
                () -> checkRotation("round_robin", ids, weights, low, new HashSet<>(), 7));
        assertTrue(error.getMessage().contains("ticket 5, one of the 7 drawn out of band"), error.getMessage());
        checkRotation("round_robin", ids, weights, low, new HashSet<>(), 5);
    }

    /**
     * {@code rotation} over {@code received}: every call carried a ticket, none of the
     * {@code drawn} tickets drawn out of band before the step (0..drawn-1), none used twice
     * ({@code seen} holds the tickets of earlier checks and gains these), and each reached the
     * instance the rule maps its ticket to over {@code rotation} in id order.
     */
    static void checkRotation(String rule, List<String> rotation, Map<String, Integer> weights, List<EchoFleet.Received> received,
            Set<Long> seen, long drawn) {
        List<String> ids = new ArrayList<>(new TreeSet<>(rotation));
        RuleOracle oracle = new RuleOracle(rule, ids.stream().mapToInt(weights::get).toArray());
        for (EchoFleet.Received r : received) {
            Long t = leased(r);
            assertNotNull(t, "call to " + r.instance() + " without a leased ticket");
            assertTrue(Long.compareUnsigned(t, drawn) >= 0,
                    "call to " + r.instance() + " carried ticket " + t + ", one of the " + drawn + " drawn out of band");
            assertTrue(seen.add(t), "ticket " + t + " used twice");
            assertEquals(ids.get(oracle.position(t)), r.instance(), "ticket " + t);
        }
    }

    private static Long leased(EchoFleet.Received r) {
        return r.ticket() == null || r.ticket().startsWith("L") ? null : Long.parseUnsignedLong(r.ticket());
    }

    private static final class Runner implements AutoCloseable {
        final JsonNode scenario;
        final String rule;
        RotaServer rota;
        final EchoFleet fleet = new EchoFleet();
        final RotaClient provider;
        final Map<String, Registration> registrations = new HashMap<>();
        final Map<String, Integer> weights = new HashMap<>();
        final String target;
        final ManagedChannel channel;
        final Set<Long> seen = new HashSet<>();
        final String service;
        /** Tickets drawn out of band (draw steps) so far. */
        long drawn;

        Runner(JsonNode scenario) throws Exception {
            this.scenario = scenario;
            this.rule = scenario.get("rule").asText();
            rota = RotaServer.startWithAdminOn("127.0.0.1:0");
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
                weights.put(id, instance.weight());
                registrations.put(id, provider.register(instance));
            }
            service = scenario.path("service").asText("echo");
            if (scenario.has("policy")) {
                // Proto JSON of a rota.v1.Policy without its service, set before the channel opens.
                io.rota.v1.Policy.Builder policy = io.rota.v1.Policy.newBuilder();
                com.google.protobuf.util.JsonFormat.parser().merge(JSON.writeValueAsString(scenario.get("policy")), policy);
                io.rota.v1.PoliciesGrpc.newBlockingStub(provider.channel()).withDeadlineAfter(10, TimeUnit.SECONDS)
                        .setPolicy(io.rota.v1.SetPolicyRequest.newBuilder().setPolicy(policy.setService(service)).build());
            }
            target = "rota://" + rota.target() + "/" + service;
            channel = ManagedChannelBuilder.forTarget(target)
                    .setNameResolverArg(RotaChannels.RULE, rule)
                    .setNameResolverArg(RotaChannels.TICKET_HEADER_ENABLED, true)
                    .usePlaintext().build();
        }

        String call(String version, long deadlineMs) {
            EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
            if (!version.isEmpty()) {
                Metadata headers = new Metadata();
                headers.put(RotaChannels.VERSION_KEY, version);
                stub = stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
            }
            try {
                stub.withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS).echo(EchoRequest.newBuilder().setMessage("first").build());
                return null;
            } catch (StatusRuntimeException e) {
                return String.valueOf(e.getStatus().getDescription());
            }
        }

        /**
         * Makes one call through the channel; the instances whose echo servers received it (the
         * runner's calls are one after another, so what they record meanwhile is this call's).
         */
        List<String> reachedByCall() {
            int before = fleet.received.size();
            call("", 5000);
            List<EchoFleet.Received> all = List.copyOf(fleet.received);
            return all.subList(before, all.size()).stream().map(EchoFleet.Received::instance).toList();
        }

        void step(JsonNode step) throws Exception {
            if (step.has("calls")) {
                calls(step);
            } else if (step.has("withdraw")) {
                String id = step.get("withdraw").asText();
                long within = step.get("within_ms").asLong();
                registrations.remove(id).close();
                List<CallsAfterChange.Made> made = CallsAfterChange.make(this::reachedByCall, System.nanoTime(), within, System::nanoTime);
                System.out.println(scenario.path("name").asText() + ": " + id + ", after its withdrawal: "
                        + CallsAfterChange.summary(made, within));
                CallsAfterChange.check(made, id, within, "its withdrawal");
            } else if (step.has("kill")) {
                fleet.kill(step.get("kill").asText());
                // A call already on its way to the dead instance may fail. As many calls in a
                // row as there are instances span a pick of the dead one, which the channel
                // can only have passed over: then it has seen the death.
                int want = scenario.get("instances").size();
                int inARow = 0;
                for (int i = 0; i < 10 * want && inARow < want; i++) {
                    inARow = call("", 5000) == null ? inARow + 1 : 0;
                }
                assertEquals(want, inARow, want + " calls in a row did not get through after the kill");
            } else if (step.has("hang")) {
                fleet.hang(step.get("hang").asText());
            } else if (step.path("stop_rota").asBoolean()) {
                rota.kill();
            } else if (step.path("restart_rota").asBoolean()) {
                rota = RotaServer.startWithAdminOn(rota.target());
                // Over when rota lists again every instance whose registration is open.
                Set<String> open = new TreeSet<>(registrations.keySet());
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
                while (true) {
                    Set<String> listed = new TreeSet<>();
                    try {
                        provider.listInstances("echo").instances().forEach(i -> listed.add(i.id()));
                    } catch (io.rota.client.RotaException e) {
                        // rota is not answering yet
                    }
                    if (listed.containsAll(open)) {
                        break;
                    }
                    assertTrue(System.nanoTime() < deadline, "rota lists " + listed + ", not " + open + ", 20 s after its restart");
                    Thread.sleep(20);
                }
            } else if (step.path("await_leases").asBoolean()) {
                long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(step.get("within_ms").asLong());
                while (true) {
                    int before = fleet.received.size();
                    call("", 5000);
                    List<EchoFleet.Received> all = List.copyOf(fleet.received);
                    if (all.subList(before, all.size()).stream().anyMatch(r -> leased(r) != null)) {
                        return;
                    }
                    assertTrue(System.nanoTime() < deadline, "no leased ticket in time");
                    Thread.sleep(20);
                }
            } else if (step.has("draw")) {
                draw(step.get("draw").asInt());
            } else {
                throw new AssertionError("unknown step " + step);
            }
        }

        /**
         * Leases {@code n} tickets of the channel's service and rule, without a version, with the
         * generated Balancer stub on a channel of its own: neither the client library nor the
         * channel under test takes part.
         */
        void draw(int n) throws InterruptedException {
            ManagedChannel own = ManagedChannelBuilder.forTarget(rota.target()).usePlaintext().build();
            try {
                io.rota.v1.LeaseResponse response = io.rota.v1.BalancerGrpc.newBlockingStub(own)
                        .withDeadlineAfter(10, TimeUnit.SECONDS)
                        .lease(io.rota.v1.LeaseRequest.newBuilder().setService(service).setRule(rule).setCount(n).build());
                assertTrue(response.getCount() == n && response.getPicksCount() == 0,
                        "rota leased " + response.getCount() + " tickets, not " + n);
            } finally {
                own.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            }
            drawn += n;
        }

        void calls(JsonNode step) throws Exception {
            int n = step.get("calls").asInt();
            String version = step.path("version").asText("");
            long deadlineMs = step.path("deadline_ms").asLong(5000);
            int before = fleet.received.size();
            List<Process> others = new ArrayList<>();
            String java = ProcessHandle.current().info().command().orElse("java");
            for (int c = 1; c < step.path("consumers").asInt(1); c++) {
                others.add(new ProcessBuilder(java, "-XX:TieredStopAtLevel=1", "-cp", System.getProperty("java.class.path"),
                        EchoConsumer.class.getName(), target, rule, String.valueOf(n), version, String.valueOf(deadlineMs))
                        .redirectError(ProcessBuilder.Redirect.DISCARD).start());
            }
            List<String> failures = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                String failure = call(version, deadlineMs);
                if (failure != null) {
                    failures.add(failure);
                }
            }
            for (Process process : others) {
                String out = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
                assertTrue(process.waitFor(120, TimeUnit.SECONDS), "second consumer did not end");
                assertTrue(out.contains("DONE"), "second consumer: " + out);
                out.lines().filter(l -> l.startsWith("FAILED ")).forEach(l -> failures.add(l.substring(7)));
            }
            List<EchoFleet.Received> all = List.copyOf(fleet.received);
            List<EchoFleet.Received> received = all.subList(before, all.size());
            Map<String, Integer> reached = new java.util.TreeMap<>();
            received.forEach(r -> reached.merge(r.instance() + (r.hung() ? " (hung)" : ""), 1, Integer::sum));
            System.out.println(scenario.path("name").asText() + ": " + n + " calls, " + failures.size() + " failed, reached " + reached);
            check(step.path("expect"), received, failures);
            if (step.path("expect").path("reported").asBoolean()) {
                System.out.println(scenario.path("name").asText() + ": rota reports calls " + reported() + ", no error");
            }
        }

        /** Bounds of reported's poll of rota's admin API. */
        private static final long REPORTED_WITHIN_MS = 10_000;
        private static final long REPORTED_EVERY_MS = 75;
        private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();

        /**
         * Polls rota's admin API (GET /api/services/echo) until every instance of the scenario
         * shows as many calls as its echo server answered since the scenario started, and no
         * error; returns those counts, or fails with both numbers per id after
         * {@link #REPORTED_WITHIN_MS}.
         */
        Map<String, Long> reported() throws Exception {
            Map<String, Long> want = new java.util.TreeMap<>();
            scenario.get("instances").forEach(i -> want.put(i.get("id").asText(), 0L));
            for (EchoFleet.Received r : List.copyOf(fleet.received)) {
                if (!r.hung()) {
                    want.merge(r.instance(), 1L, Long::sum);
                }
            }
            HttpRequest request = HttpRequest.newBuilder(URI.create("http://" + rota.admin() + "/api/services/echo"))
                    .timeout(Duration.ofSeconds(2)).GET().build();
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(REPORTED_WITHIN_MS);
            while (true) {
                long next = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(REPORTED_EVERY_MS);
                Map<String, long[]> got = new java.util.TreeMap<>();
                String problem = null;
                try {
                    HttpResponse<String> response = http.send(request, HttpResponse.BodyHandlers.ofString());
                    if (response.statusCode() != 200) {
                        problem = "GET " + request.uri() + ": " + response.statusCode() + " " + response.body();
                    } else {
                        for (JsonNode inst : JSON.readTree(response.body()).path("instances")) {
                            got.put(inst.path("id").asText(), new long[] {inst.path("calls").asLong(), inst.path("errors").asLong()});
                        }
                    }
                } catch (IOException e) {
                    problem = "GET " + request.uri() + ": " + e;
                }
                boolean matches = problem == null && want.entrySet().stream().allMatch(w -> got.containsKey(w.getKey())
                        && got.get(w.getKey())[0] == w.getValue() && got.get(w.getKey())[1] == 0);
                if (matches) {
                    return want;
                }
                if (System.nanoTime() - deadline > 0) {
                    if (problem != null) {
                        throw new AssertionError("reported: after " + REPORTED_WITHIN_MS + " ms, " + problem);
                    }
                    List<String> lines = new ArrayList<>();
                    want.forEach((id, calls) -> lines.add(got.containsKey(id)
                            ? id + ": rota counts " + got.get(id)[0] + " calls and " + got.get(id)[1] + " errors, its echo server answered "
                                    + calls + " calls (errors want 0)"
                            : id + ": not in rota's view, its echo server answered " + calls + " calls"));
                    throw new AssertionError("reported: rota's admin API did not match within " + REPORTED_WITHIN_MS + " ms: "
                            + String.join("; ", lines));
                }
                // The next poll 75 ms after this one started, bounded by the deadline above.
                TimeUnit.NANOSECONDS.sleep(Math.max(0, next - System.nanoTime()));
            }
        }

        void check(JsonNode expect, List<EchoFleet.Received> received, List<String> failures) {
            if (expect.has("failures")) {
                assertEquals(expect.get("failures").asInt(), failures.size(),
                        (failures.size() > 3 ? failures.subList(0, 3) + " and " + (failures.size() - 3) + " more" : failures.toString()));
            }
            if (expect.has("error_contains")) {
                String text = expect.get("error_contains").asText();
                assertTrue(failures.stream().allMatch(f -> f.contains(text)), failures.toString());
            }
            if (expect.path("leased").isBoolean()) {
                boolean all = expect.get("leased").asBoolean();
                assertTrue(received.stream().allMatch(r -> (leased(r) != null) == all), "leased " + all);
            }
            Set<String> reached = new HashSet<>();
            received.forEach(r -> reached.add(r.instance()));
            if (expect.has("rotation")) {
                checkRotation(rule, strings(expect.get("rotation")), weights, received, seen, drawn);
            }
            if (expect.has("runs")) {
                int size = expect.get("runs").asInt();
                Map<Long, String> byTicket = new HashMap<>();
                received.forEach(r -> {
                    if (leased(r) != null) {
                        byTicket.put(leased(r), r.instance());
                    }
                });
                for (long t : byTicket.keySet()) {
                    long group = t - t % size;
                    Set<String> in = new HashSet<>();
                    boolean complete = true;
                    for (long k = 0; k < size; k++) {
                        complete &= byTicket.containsKey(group + k);
                        in.add(byTicket.get(group + k));
                    }
                    assertTrue(!complete || in.size() == 1, "run from " + group);
                }
            }
            if (expect.has("only")) {
                assertTrue(strings(expect.get("only")).containsAll(reached), reached.toString());
            }
            if (expect.has("never")) {
                assertTrue(strings(expect.get("never")).stream().noneMatch(reached::contains), reached.toString());
            }
            if (expect.path("spread").asBoolean()) {
                assertEquals(new HashSet<>(strings(expect.get("only"))), reached);
            }
            if (expect.path("balanced").asBoolean()) {
                // Over the answered calls (a hung server answers none) of the ids in `only`.
                Map<String, Integer> answered = new java.util.TreeMap<>();
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
                int most = java.util.Collections.max(answered.values());
                int fewest = java.util.Collections.min(answered.values());
                assertTrue(fewest > 0, "not every instance answered: " + answered);
                assertTrue(most - fewest <= Math.max(2, total / 10), "unbalanced over " + total + " answered calls: " + answered);
            }
            if (expect.has("counts")) {
                Map<String, Integer> wanted = new java.util.TreeMap<>();
                JsonNode counts = expect.get("counts");
                counts.fieldNames().forEachRemaining(id -> {
                    if (counts.get(id).asInt() != 0) {
                        wanted.put(id, counts.get(id).asInt());
                    }
                });
                Map<String, Integer> got = new java.util.TreeMap<>();
                received.forEach(r -> got.merge(r.instance(), 1, Integer::sum));
                assertEquals(wanted, got, "calls per instance");
            }
        }

        private static List<String> strings(JsonNode array) {
            List<String> out = new ArrayList<>();
            array.forEach(n -> out.add(n.asText()));
            return out;
        }

        @Override
        public void close() throws Exception {
            channel.shutdownNow();
            provider.close();
            fleet.close();
            rota.close();
        }
    }
}
