package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Assertions;

import com.fasterxml.jackson.databind.JsonNode;

import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.rota.client.testing.Await;
import io.rota.client.testing.RotaServer;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.WatchEvent;
import io.rota.v1.WatchRequest;

/**
 * One run of a conformance scenario through the client's public API, with the step semantics of
 * {@code clients/conformance/README.md}. A key the README does not define fails the step (a
 * misspelt expectation would otherwise be skipped silently). Calls the client does not wrap
 * ({@code Lease}, a raw {@code Watch}) go through the generated stubs on {@link RotaClient#channel()},
 * as the client's README tells users to.
 */
final class ScenarioRun implements AutoCloseable {
    /** How long a step may wait for something to arrive (a watch event, a followed list). */
    static final Duration PATIENCE = Duration.ofSeconds(20);

    static final Set<String> SCENARIO_KEYS = Set.of("name", "connections", "steps");
    private static final Map<String, Set<String>> STEP_KEYS = Map.ofEntries(
            Map.entry("register", Set.of("op", "stream", "instances", "expect_accepted", "expect_refused")),
            Map.entry("withdraw", Set.of("op", "stream")),
            Map.entry("pick", Set.of("op", "connection", "request", "expect")),
            Map.entry("pick_sequence", Set.of("op", "connections", "request", "count", "expect_ids", "expect_fallback",
                    "expect_tickets", "expect_rule", "expect_local")),
            Map.entry("list", Set.of("op", "service", "expect_ids")),
            Map.entry("update", Set.of("op", "stream", "service", "id", "status", "weight")),
            Map.entry("report", Set.of("op", "connection", "outcomes", "expect_accepted", "expect_ignored")),
            Map.entry("lease", Set.of("op", "connection", "request", "expect")),
            Map.entry("watch", Set.of("op", "watch", "connection", "service")),
            Map.entry("watch_expect", Set.of("op", "watch", "events")),
            Map.entry("follow", Set.of("op", "connection", "service", "expect_ids")),
            Map.entry("stop_server", Set.of("op")),
            Map.entry("start_server", Set.of("op", "warmup")));
    private static final Set<String> REQUEST_KEYS = Set.of("service", "rule", "version", "key", "zone", "exclude");
    private static final Set<String> LEASE_REQUEST_KEYS = Set.of("service", "rule", "version", "count", "exclude");
    private static final Set<String> INSTANCE_KEYS = Set.of("service", "id", "host", "port", "version", "zone", "weight",
            "metadata", "status");
    private static final Set<String> EXPECT_KEYS = Set.of("id", "fallback", "ticket", "rule", "local", "error",
            "message_contains", "unreachable");
    private static final Set<String> LEASE_EXPECT_KEYS = Set.of("first_ticket", "count", "ids", "positions", "rule", "fallback");
    private static final Set<String> REFUSAL_KEYS = Set.of("id", "code");
    private static final Set<String> OUTCOME_KEYS = Set.of("service", "instance_id", "ticket", "rule", "latency_us",
            "result");
    private static final Set<String> EVENT_KEYS = Set.of("snapshot", "added", "updated", "removed", "status");

    private RotaServer server;
    /** The servers this run started (start_server), closed with it. */
    private final List<RotaServer> started = new ArrayList<>();
    /** Registers for the register steps; null after stop_server until the next one needs it. */
    private RotaClient provider;
    private final List<RotaClient> clients = new ArrayList<>();
    private final Map<String, Registration> streams = new LinkedHashMap<>();
    private final Map<String, Watch> watches = new LinkedHashMap<>();

    ScenarioRun(RotaServer server, int connections) {
        this.server = server;
        provider = client(server);
        for (int i = 0; i < connections; i++) {
            clients.add(client(server));
        }
    }

    private static RotaClient client(RotaServer server) {
        return RotaClient.builder().target(server.target()).pickTimeout(Duration.ofSeconds(10)).build();
    }

    /** Whether a scenario stops (or starts) its server, so that it needs a server of its own. */
    static boolean stopsTheServer(JsonNode scenario) {
        for (JsonNode step : scenario.path("steps")) {
            if (step.path("op").asText().equals("stop_server")) {
                return true;
            }
        }
        return false;
    }

    /** Runs every step; fails with the index of the first step whose expectation fails. */
    static void run(RotaServer server, JsonNode scenario) {
        checkKeys("scenario", scenario, SCENARIO_KEYS);
        String name = scenario.path("name").asText();
        try (ScenarioRun run = new ScenarioRun(server, scenario.path("connections").asInt(1))) {
            JsonNode steps = scenario.path("steps");
            for (int index = 0; index < steps.size(); index++) {
                JsonNode step = steps.get(index);
                String where = "scenario \"" + name + "\", step " + index + " (" + step.path("op").asText() + ")";
                try {
                    checkStep(step);
                    run.step(step);
                } catch (AssertionError | RuntimeException e) {
                    throw new AssertionError(where + ": " + e.getMessage(), e);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new AssertionError(where + ": interrupted", e);
                }
            }
        }
    }

    @Override
    public void close() {
        watches.values().forEach(Watch::cancel);
        streams.values().forEach(Registration::close);
        clients.forEach(RotaClient::close);
        if (provider != null) {
            provider.close();
        }
        started.forEach(RotaServer::close);
    }

    // --- keys ------------------------------------------------------------------------------------

    static void checkKeys(String what, JsonNode node, Set<String> allowed) {
        if (node.isMissingNode()) {
            return;
        }
        if (!node.isObject()) {
            fail(what + " is not an object: " + node);
        }
        for (String key : (Iterable<String>) node::fieldNames) {
            if (!allowed.contains(key)) {
                fail("unknown key \"" + key + "\" in " + what + " (known: " + new TreeSet<>(allowed) + ")");
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
        checkKeys("request", step.path("request"), op.equals("lease") ? LEASE_REQUEST_KEYS : REQUEST_KEYS);
        checkKeys("expect", step.path("expect"), op.equals("lease") ? LEASE_EXPECT_KEYS : EXPECT_KEYS);
        for (JsonNode instance : step.path("instances")) {
            checkKeys("instance", instance, INSTANCE_KEYS);
        }
        for (JsonNode refusal : step.path("expect_refused")) {
            checkKeys("expect_refused entry", refusal, REFUSAL_KEYS);
        }
        for (JsonNode outcome : step.path("outcomes")) {
            checkKeys("outcome", outcome, OUTCOME_KEYS);
        }
        for (JsonNode event : step.path("events")) {
            checkKeys("event", event, EVENT_KEYS);
        }
    }

    // --- steps -----------------------------------------------------------------------------------

    private RotaClient connection(JsonNode index) {
        int i = index.asInt(0);
        assertTrue(i >= 0 && i < clients.size(), "the scenario has no connection " + i);
        return clients.get(i);
    }

    private void step(JsonNode step) throws InterruptedException {
        switch (step.path("op").asText()) {
            case "register" -> register(step);
            case "withdraw" -> {
                Registration registration = streams.remove(step.path("stream").asText());
                assertNotNull(registration, "no open stream named " + step.path("stream").asText());
                List<String> held = registration.instances().stream()
                        .sorted(java.util.Comparator.comparing(Instance::service).thenComparing(Instance::id))
                        .map(i -> i.service() + "/" + i.id()).toList();
                Ack ack = registration.withdraw();
                assertEquals(held, ack.accepted().stream().map(r -> r.service() + "/" + r.id()).toList(),
                        "withdrawn instances");
                registration.close();
            }
            case "pick" -> checkPick(connection(step.path("connection")), PickStep.of(step.path("request")),
                    step.path("expect"));
            case "pick_sequence" -> pickSequence(step);
            case "list" -> assertEquals(strings(step.path("expect_ids")),
                    clients.get(0).listInstances(step.path("service").asText()).ids(), "listed ids");
            case "update" -> update(step);
            case "report" -> report(step);
            case "lease" -> lease(step);
            case "watch" -> watches.put(step.path("watch").asText(),
                    new Watch(connection(step.path("connection")), step.path("service").asText()));
            case "watch_expect" -> watchExpect(step);
            case "follow" -> {
                RotaClient client = connection(step.path("connection"));
                String service = step.path("service").asText();
                List<String> expected = strings(step.path("expect_ids"));
                client.follow(service);
                Await.until("the followed list " + expected, PATIENCE,
                        () -> client.lastKnownInstances(service).stream().map(Instance::id).toList().equals(expected));
            }
            case "stop_server" -> {
                server.kill();
                // The providers are gone with it: nothing re-announces to a later server.
                streams.values().forEach(Registration::close);
                streams.clear();
                provider.close();
                provider = null;
            }
            case "start_server" -> {
                try {
                    server = RotaServer.startOn(server.target(), "--warmup", step.path("warmup").asText());
                } catch (java.io.IOException e) {
                    throw new java.io.UncheckedIOException(e);
                }
                started.add(server);
            }
            default -> fail("unknown op " + step.path("op"));
        }
    }

    private void register(JsonNode step) {
        List<Instance> instances = new ArrayList<>();
        for (JsonNode node : step.path("instances")) {
            instances.add(instance(node));
        }
        String name = step.path("stream").asText();
        Registration open = streams.get(name);
        Ack ack;
        if (open == null) {
            if (provider == null) {
                provider = client(server);
            }
            // Refusals are part of what a step checks, so they must not throw here.
            Registration registration = provider.registerAllowingPartial(instances);
            streams.put(name, registration);
            ack = registration.ack();
        } else {
            ack = open.announce(instances);
        }
        Set<String> refused = new HashSet<>();
        for (Refusal refusal : ack.refused()) {
            refused.add(refusal.instance().id() + "=" + refusal.code());
        }
        List<String> expectedAccepted = step.has("expect_accepted") ? strings(step.path("expect_accepted"))
                : instances.stream().map(i -> i.ref().id()).toList();
        Set<String> expectedRefused = new HashSet<>();
        for (JsonNode r : step.path("expect_refused")) {
            expectedRefused.add(r.path("id").asText() + "=" + code(r.path("code")));
        }
        assertEquals(expectedAccepted, ack.acceptedIds(), "accepted ids");
        assertEquals(expectedRefused, refused, "refused (id=code)");
    }

    private void pickSequence(JsonNode step) {
        List<Integer> order = new ArrayList<>();
        for (JsonNode c : step.path("connections")) {
            order.add(c.asInt());
        }
        assertFalse(order.isEmpty(), "pick_sequence names at least one connection");
        PickStep request = PickStep.of(step.path("request"));
        boolean local = step.path("expect_local").asBoolean(false);
        List<String> ids = new ArrayList<>();
        List<Long> tickets = new ArrayList<>();
        for (int i = 0; i < step.path("count").asInt(); i++) {
            Pick pick = request.run(connection(step.path("connections").get(i % order.size())));
            assertEquals(local, pick.localFallback(), "pick " + i + " made locally");
            if (step.has("expect_fallback")) {
                assertEquals(step.path("expect_fallback").asBoolean(), pick.isFallback(),
                        "fallback of pick " + i + ": \"" + pick.fallback() + "\"");
            }
            if (step.has("expect_rule")) {
                assertEquals(step.path("expect_rule").asText(), pick.rule(), "rule of pick " + i);
            }
            ids.add(pick.id());
            tickets.add(pick.ticket());
        }
        assertEquals(strings(step.path("expect_ids")), ids, "picked ids");
        if (step.has("expect_tickets")) {
            List<Long> expected = new ArrayList<>();
            step.path("expect_tickets").forEach(t -> expected.add(t.asLong()));
            assertEquals(expected, tickets, "tickets");
        }
    }

    private static void checkPick(RotaClient client, PickStep request, JsonNode expect) {
        if (expect.has("error")) {
            RotaException e = Assertions.assertThrows(RotaException.class, () -> request.run(client));
            assertEquals(expect.path("error").asText(), e.getCode().name(), "status code (" + e.getMessage() + ")");
            if (expect.has("unreachable")) {
                assertEquals(expect.path("unreachable").asBoolean(), e.isUnreachable(),
                        "unreachable (reason \"" + e.reason() + "\")");
            }
            if (expect.has("message_contains")) {
                String part = expect.path("message_contains").asText();
                assertTrue(e.getDescription().contains(part), "message \"" + e.getDescription() + "\" contains \"" + part + "\"");
            }
            return;
        }
        Pick pick = request.run(client);
        assertEquals(expect.path("local").asBoolean(false), pick.localFallback(), "made locally");
        assertEquals(expect.path("id").asText(), pick.id(), "picked id");
        if (expect.has("fallback")) {
            assertEquals(expect.path("fallback").asBoolean(), pick.isFallback(), "fallback \"" + pick.fallback() + "\"");
        }
        if (expect.has("ticket")) {
            assertEquals(expect.path("ticket").asLong(), pick.ticket(), "ticket");
        }
        if (expect.has("rule")) {
            assertEquals(expect.path("rule").asText(), pick.rule(), "rule");
        }
    }

    private void update(JsonNode step) {
        Registration registration = streams.get(step.path("stream").asText());
        assertNotNull(registration, "no open stream named " + step.path("stream").asText());
        InstanceRef ref = new InstanceRef(step.path("service").asText(), step.path("id").asText());
        Update update = Update.of(ref);
        if (step.has("status")) {
            update = update.withStatus(InstanceStatus.valueOf(step.path("status").asText()));
        }
        if (step.has("weight")) {
            update = update.withWeight(step.path("weight").asInt());
        }
        Ack ack = registration.update(update);
        assertEquals(List.of(ref), ack.accepted(), "updated");
        assertEquals(List.of(), ack.refused(), "refused");
    }

    private void report(JsonNode step) {
        List<CallOutcome> outcomes = new ArrayList<>();
        for (JsonNode o : step.path("outcomes")) {
            outcomes.add(new CallOutcome(o.path("service").asText(), o.path("instance_id").asText(),
                    o.path("ticket").asLong(0), o.path("rule").asText(""),
                    Duration.ofNanos(o.path("latency_us").asLong(0) * 1000), CallResult.valueOf(o.path("result").asText())));
        }
        ReportResult result = connection(step.path("connection")).report(outcomes);
        assertEquals(new ReportResult(step.path("expect_accepted").asInt(outcomes.size()),
                step.path("expect_ignored").asInt(0)), result, "report (accepted, ignored)");
    }

    private void lease(JsonNode step) {
        JsonNode r = step.path("request");
        JsonNode expect = step.path("expect");
        LeaseResponse leased = BalancerGrpc.newBlockingStub(connection(step.path("connection")).channel())
                .withDeadlineAfter(PATIENCE.toMillis(), TimeUnit.MILLISECONDS)
                .lease(LeaseRequest.newBuilder().setService(r.path("service").asText()).setRule(r.path("rule").asText(""))
                        .setVersion(r.path("version").asText("")).setCount(r.path("count").asInt(0))
                        .addAllExclude(strings(r.path("exclude"))).build());
        assertEquals(expect.path("first_ticket").asLong(), leased.getFirstTicket(), "first ticket");
        assertEquals(expect.path("count").asInt(), leased.getCount(), "count");
        assertEquals(strings(expect.path("ids")), leased.getInstancesList().stream().map(io.rota.v1.Instance::getId).toList(),
                "leased instances");
        if (expect.has("positions")) {
            List<Integer> positions = new java.util.ArrayList<>();
            expect.path("positions").forEach(p -> positions.add(p.asInt()));
            assertEquals(positions, leased.getPositionsList(), "positions");
        }
        if (expect.has("rule")) {
            assertEquals(expect.path("rule").asText(), leased.getRule(), "rule");
        }
        if (expect.has("fallback")) {
            assertEquals(expect.path("fallback").asBoolean(), !leased.getFallback().isEmpty(),
                    "fallback \"" + leased.getFallback() + "\"");
        }
    }

    private void watchExpect(JsonNode step) throws InterruptedException {
        Watch watch = watches.get(step.path("watch").asText());
        assertNotNull(watch, "no watch named " + step.path("watch").asText());
        int n = 0;
        for (JsonNode expected : step.path("events")) {
            assertEquals(describe(expected), watch.next(), "event " + n);
            n++;
        }
    }

    /** An expected event as {@code kind ids} (with the status of an update). */
    private static String describe(JsonNode event) {
        List<String> kinds = new ArrayList<>();
        for (String kind : List.of("snapshot", "added", "updated", "removed")) {
            if (event.has(kind)) {
                kinds.add(kind);
            }
        }
        assertEquals(1, kinds.size(), "an event names exactly one of snapshot, added, updated, removed: " + event);
        return switch (kinds.get(0)) {
            case "snapshot" -> "snapshot " + strings(event.path("snapshot"));
            case "updated" -> "updated " + event.path("updated").asText() + " " + event.path("status").asText("UP");
            default -> kinds.get(0) + " " + event.path(kinds.get(0)).asText();
        };
    }

    /** A raw {@code Watch} whose events queue up until a step reads them. */
    private static final class Watch implements ClientResponseObserver<WatchRequest, WatchEvent> {
        private final BlockingQueue<Object> events = new LinkedBlockingQueue<>();
        private volatile ClientCallStreamObserver<WatchRequest> call;

        Watch(RotaClient client, String service) {
            RegistryGrpc.newStub(client.channel()).watch(WatchRequest.newBuilder().setService(service).build(), this);
        }

        String next() throws InterruptedException {
            Object event = events.poll(PATIENCE.toMillis(), TimeUnit.MILLISECONDS);
            if (event == null) {
                fail("no event within " + PATIENCE.toMillis() + " ms");
            }
            if (event instanceof Throwable t) {
                fail("the watch ended: " + Status.fromThrowable(t));
            }
            WatchEvent e = (WatchEvent) event;
            return switch (e.getEventCase()) {
                case SNAPSHOT -> "snapshot " + e.getSnapshot().getInstancesList().stream().map(io.rota.v1.Instance::getId).toList();
                case ADDED -> "added " + e.getAdded().getId();
                case UPDATED -> "updated " + e.getUpdated().getId() + " " + Wire.instance(e.getUpdated()).status();
                case REMOVED -> "removed " + e.getRemoved().getId();
                case EVENT_NOT_SET -> "nothing";
            };
        }

        void cancel() {
            if (call != null) {
                call.cancel("scenario over", null);
            }
        }

        @Override
        public void beforeStart(ClientCallStreamObserver<WatchRequest> requestStream) {
            call = requestStream;
        }

        @Override
        public void onNext(WatchEvent value) {
            events.add(value);
        }

        @Override
        public void onError(Throwable t) {
            events.add(t);
        }

        @Override
        public void onCompleted() {
            events.add(new IllegalStateException("completed"));
        }
    }

    // --- helpers ---------------------------------------------------------------------------------

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

    static List<String> strings(JsonNode array) {
        List<String> out = new ArrayList<>();
        for (JsonNode n : array) {
            out.add(n.asText());
        }
        return out;
    }
}
