package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.rota.client.testing.Await;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;
import io.rota.client.testing.TcpProxy;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.PickRequest;

/** The client against live rota servers: the shared one, and private ones for tests that kill them. */
@ExtendWith(SharedRotaServer.class)
class ClientIntegrationTest {

    private static Instance instance(String service, String id, int port) {
        return Instance.of(service, "127.0.0.1", port).withId(id);
    }

    @Test
    void registeredInstancesArePickedAndCloseWithdrawsThem(RotaServer rota) {
        try (RotaClient provider = RotaClient.builder().target(rota.target()).build();
                RotaClient consumer = RotaClient.builder().target(rota.target()).build()) {
            Registration registration = provider.register(instance("it-register", "one", 7001),
                    instance("it-register", "two", 7002));
            assertEquals(List.of("one", "two"), registration.ack().acceptedIds());
            assertEquals(List.of(), registration.ack().refused());
            assertTrue(registration.ack().heartbeatTimeout().toMillis() > 0);
            assertTrue(registration.isConnected());

            Pick first = consumer.pick("it-register");
            Pick second = consumer.pick("it-register");
            assertEquals("one", first.id());
            assertEquals("127.0.0.1", first.host());
            assertEquals(7001, first.port());
            assertEquals("127.0.0.1:7001", first.authority());
            assertEquals(0, first.ticket());
            assertEquals("round_robin", first.rule());
            assertEquals("", first.fallback());
            assertFalse(first.localFallback());
            assertEquals("two", second.id());
            assertEquals(1, second.ticket());

            registration.close();
            assertFalse(registration.isConnected());
            RotaException gone = assertThrows(RotaException.class, () -> consumer.pick("it-register"));
            assertEquals(Status.Code.UNAVAILABLE, gone.getCode());
            assertEquals(List.of(), consumer.listInstances("it-register").instances());
        }
    }

    @Test
    void aRefusedInstanceFailsTheRegistrationAndNothingStays(RotaServer rota) {
        try (RotaClient provider = RotaClient.builder().target(rota.target()).build()) {
            RegistrationRefusedException e = assertThrows(RegistrationRefusedException.class,
                    () -> provider.register(instance("it-refused-all", "good", 7111), instance("it-refused-all", "bad", 0)));
            assertEquals(Status.Code.INVALID_ARGUMENT, e.getCode());
            assertEquals(List.of("good"), e.ack().acceptedIds());
            assertEquals(List.of(new InstanceRef("it-refused-all", "bad")),
                    e.refused().stream().map(Refusal::instance).toList());
            assertTrue(e.getDescription().contains("it-refused-all/bad"), e.getDescription());
            // The accepted instance was withdrawn again.
            assertEquals(List.of(), provider.listInstances("it-refused-all").instances());
        }
    }

    @Test
    void partialAcceptanceIsOptIn(RotaServer rota) {
        try (RotaClient provider = RotaClient.builder().target(rota.target()).build()) {
            Registration registration = provider.registerAllowingPartial(instance("it-refused", "good", 7101),
                    instance("it-refused", "bad", 0));
            Ack ack = registration.ack();
            assertEquals(List.of("good"), ack.acceptedIds());
            assertEquals(1, ack.refused().size());
            assertEquals(new InstanceRef("it-refused", "bad"), ack.refused().get(0).instance());
            assertEquals(Status.Code.INVALID_ARGUMENT, ack.refused().get(0).code());
            assertEquals(List.of("good"), registration.instances().stream().map(Instance::id).toList());
            assertEquals(List.of("good"), provider.listInstances("it-refused").ids());
            registration.close();
        }
    }

    @Test
    void announceUpdateAndWithdrawOnOneRegistration(RotaServer rota) {
        try (RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            Registration registration = client.register(instance("it-update", "a", 7201));
            Ack added = registration.announce(instance("it-update", "b", 7202));
            assertEquals(List.of("b"), added.acceptedIds());
            assertEquals(2, added.seq());

            InstanceRef a = new InstanceRef("it-update", "a");
            Ack drained = registration.update(Update.of(a).withStatus(InstanceStatus.DRAINING));
            assertEquals(List.of(a), drained.accepted());
            assertEquals(List.of("b", "b"), List.of(client.pick("it-update").id(), client.pick("it-update").id()));
            assertEquals(InstanceStatus.DRAINING, registration.instances().get(0).status());

            Ack withdrawn = registration.withdraw(new InstanceRef("it-update", "b"));
            assertEquals(1, withdrawn.accepted().size());
            assertEquals(List.of("a"), registration.instances().stream().map(Instance::id).toList());
            RotaException none = assertThrows(RotaException.class, () -> client.pick("it-update"));
            assertEquals(Status.Code.UNAVAILABLE, none.getCode());
            registration.close();
        }
    }

    @Test
    void reportReturnsAcceptedAndIgnoredCounts(RotaServer rota) {
        try (RotaClient client = RotaClient.builder().target(rota.target()).build();
                Registration registration = client.register(instance("it-report", "a", 7301))) {
            Pick pick = client.pick("it-report");
            ReportResult result = client.report(
                    pick.outcome(CallResult.OK, Duration.ofMillis(3)),
                    pick.outcome(CallResult.ERROR, Duration.ofMillis(40)),
                    new CallOutcome("it-report", "nobody", pick.ticket(), pick.rule(), Duration.ofMillis(1), CallResult.OK));
            assertEquals(new ReportResult(2, 1), result);
            assertEquals(new ReportResult(1, 0), client.report(pick, CallResult.CONNECT_FAILURE, Duration.ofMillis(5)));
            assertEquals(new ReportResult(0, 0), client.report(List.of()));

            List<CallOutcome> many = new ArrayList<>();
            for (int i = 0; i < 2500; i++) {
                many.add(pick.outcome(CallResult.OK, Duration.ofMillis(1)));
            }
            assertEquals(new ReportResult(2500, 0), client.report(many));
            assertEquals(new ReportResult(2500, 0), client.reportAsync(many).join());
        }
    }

    @Test
    void serverAnswersAreNotUnreachable(RotaServer rota) throws Exception {
        try (RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            client.register(instance("it-transport", "a", 7401)).close();
            RotaException none = assertThrows(RotaException.class, () -> client.pick("it-transport"));
            assertEquals(Status.Code.UNAVAILABLE, none.getCode());
            assertEquals("no_eligible_instance", none.reason());
            assertFalse(none.isUnreachable());
            RotaException unknown = assertThrows(RotaException.class, () -> client.pick("it-transport-never"));
            assertEquals(Status.Code.NOT_FOUND, unknown.getCode());
            assertEquals("unknown_service", unknown.reason());
            assertFalse(unknown.isUnreachable());
            BalancerGrpc.BalancerBlockingStub stub = BalancerGrpc.newBlockingStub(client.channel());
            StatusRuntimeException answered = assertThrows(StatusRuntimeException.class,
                    () -> stub.pick(PickRequest.newBuilder().setService("it-transport").build()));
            assertFalse(RotaException.from(answered).isUnreachable());
        }
        RotaServer dead = RotaServer.start();
        String target = dead.target();
        dead.close();
        try (RotaClient client = RotaClient.builder().target(target).build()) {
            RotaException e = assertThrows(RotaException.class, () -> client.pick("x"));
            assertEquals(Status.Code.UNAVAILABLE, e.getCode());
            assertEquals("", e.reason());
            assertTrue(e.isUnreachable());
        }
    }

    @Test
    void watchFedFallbackAnswersWhenRotaIsKilled() throws Exception {
        Logger log = Logger.getLogger(RotaClient.class.getName());
        List<LogRecord> records = new ArrayList<>();
        Handler capture = new Handler() {
            @Override
            public synchronized void publish(LogRecord record) {
                records.add(record);
            }

            @Override
            public void flush() {
            }

            @Override
            public void close() {
            }
        };
        log.addHandler(capture);
        try (RotaServer rota = RotaServer.start();
                RotaClient provider = RotaClient.builder().target(rota.target()).build();
                RotaClient consumer = RotaClient.builder().target(rota.target()).follow("it-fallback").build()) {
            provider.register(instance("it-fallback", "a", 7501), instance("it-fallback", "b", 7502),
                    instance("it-fallback", "z", 7503).withVersion("zlt"));
            Await.until("the watcher to see 3 instances", Duration.ofSeconds(10),
                    () -> consumer.lastKnownInstances("it-fallback").size() == 3);
            assertEquals("a", consumer.pick("it-fallback").id());
            assertFalse(consumer.pick("it-fallback").localFallback());

            rota.kill();

            Pick first = consumer.pick("it-fallback");
            assertTrue(first.localFallback());
            assertEquals("a", first.id());
            assertEquals(7501, first.port());
            assertEquals("round_robin", first.rule());
            assertEquals("", first.fallback());
            assertEquals(0, first.ticket());
            assertEquals("b", consumer.pick("it-fallback").id());
            assertEquals("a", consumer.pick("it-fallback").id());
            Pick versioned = consumer.pick("it-fallback", PickOptions.builder().version("zlt").build());
            assertTrue(versioned.localFallback());
            assertEquals("z", versioned.id());
            assertEquals(3, consumer.lastKnownInstances("it-fallback").size());

            List<LogRecord> warnings;
            synchronized (capture) {
                warnings = records.stream().filter(r -> r.getLevel() == java.util.logging.Level.WARNING).toList();
            }
            assertEquals(1, warnings.size());
            assertTrue(warnings.get(0).getMessage().contains("rota unreachable"), warnings.get(0).getMessage());
            assertTrue(warnings.get(0).getMessage().contains("it-fallback -> a"), warnings.get(0).getMessage());

            RotaException unfollowed = assertThrows(RotaException.class, () -> consumer.pick("it-not-followed"));
            assertEquals(Status.Code.UNAVAILABLE, unfollowed.getCode());
        } finally {
            log.removeHandler(capture);
        }
    }

    @Test
    void aRestartedRotaStillWarmingUpIsAnsweredFromTheWatchedList() throws Exception {
        String service = "it-warmup";
        RotaServer first = RotaServer.start();
        RotaServer second = null;
        try (RotaClient consumer = RotaClient.builder().target(first.target()).follow(service).build()) {
            RotaClient provider = RotaClient.builder().target(first.target()).withdrawTimeout(Duration.ofMillis(100)).build();
            provider.register(instance(service, "a", 7951), instance(service, "b", 7952));
            Await.until("the watcher to see 2 instances", Duration.ofSeconds(20),
                    () -> consumer.lastKnownInstances(service).size() == 2);
            assertFalse(consumer.pick(service).localFallback());

            first.kill();
            provider.close();
            second = RotaServer.startOn(first.target(), "--warmup", "60s");
            BalancerGrpc.BalancerBlockingStub stub = BalancerGrpc.newBlockingStub(consumer.channel());
            Await.until("rota's warming_up answer", Duration.ofSeconds(30), () -> {
                try {
                    stub.withDeadlineAfter(5, java.util.concurrent.TimeUnit.SECONDS)
                            .pick(PickRequest.newBuilder().setService(service).build());
                    return false;
                } catch (StatusRuntimeException e) {
                    return RotaException.WARMING_UP.equals(RotaException.from(e).reason());
                }
            });
            Pick local = consumer.pick(service);
            assertTrue(local.localFallback());
            assertEquals("a", local.id());
            assertEquals(0, local.ticket());
            assertEquals(List.of("a", "b"), consumer.lastKnownInstances(service).stream().map(Instance::id).toList());

            // Once a provider registers again, rota answers and the picks are its own.
            try (RotaClient again = RotaClient.builder().target(second.target()).build();
                    Registration registration = again.register(instance(service, "b", 7952))) {
                Await.until("a pick answered by rota", Duration.ofSeconds(30), () -> !consumer.pick(service).localFallback());
                assertEquals("b", consumer.pick(service).id());
            }
        } finally {
            first.close();
            if (second != null) {
                second.close();
            }
        }
    }

    @Test
    void heartbeatsKeepTheRegistrationAlive() throws Exception {
        try (RotaServer rota = RotaServer.start("--heartbeat-timeout", "2s");
                RotaClient client = RotaClient.builder().target(rota.target()).build();
                Registration registration = client.register(instance("it-heartbeat", "a", 7601))) {
            assertEquals(Duration.ofSeconds(2), registration.ack().heartbeatTimeout());
            long lease = registration.leaseId();
            // Heartbeats go out every third of the timeout, no sooner: once nine went out, at least
            // three heartbeat timeouts have passed, long enough for rota to drop a silent stream.
            Await.until("nine heartbeats", Duration.ofSeconds(60), () -> registration.heartbeatsSent() >= 9);
            assertEquals("a", client.pick("it-heartbeat").id());
            assertEquals(0, registration.reconnects());
            assertEquals(lease, registration.leaseId());
        }
    }

    @Test
    void reconnectsAndAnnouncesAgainAfterTheStreamIsLost(RotaServer rota) throws Exception {
        try (TcpProxy proxy = new TcpProxy(rota.port());
                RotaClient provider = RotaClient.builder().target(proxy.target())
                        .backoff(Backoff.exponential(Duration.ofMillis(20), Duration.ofMillis(200))).build();
                RotaClient consumer = RotaClient.builder().target(rota.target()).build()) {
            Registration registration = provider.register(instance("it-reconnect", "a", 7701));
            registration.update(Update.of(new InstanceRef("it-reconnect", "a")).withWeight(7));
            long lease = registration.leaseId();
            assertNotEquals(0, lease);

            proxy.dropConnections();

            Await.until("a new lease after reconnecting", Duration.ofSeconds(20),
                    () -> registration.leaseId() != 0 && registration.leaseId() != lease);
            assertEquals(1, registration.reconnects());
            Pick pick = consumer.pick("it-reconnect");
            assertEquals("a", pick.id());
            assertEquals(7, pick.instance().weight());
            registration.close();
            RotaException gone = assertThrows(RotaException.class, () -> consumer.pick("it-reconnect"));
            assertEquals(Status.Code.UNAVAILABLE, gone.getCode());
        }
    }

    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"SIGTERM", "SIGKILL"})
    void registersAgainWhenRotaRestartsOnTheSamePort(String signal) throws Exception {
        String service = "it-restart-" + signal.toLowerCase(Locale.ROOT);
        InstanceRef b = new InstanceRef(service, "b");
        RotaServer first = RotaServer.start("--shutdown-grace", "500ms");
        RotaServer second = null;
        // The default reconnection schedule, as an application would have it.
        try (RotaClient rota = RotaClient.builder().target(first.target()).build()) {
            Registration registration = rota.register(instance(service, "a", 7901), instance(service, "b", 7902));
            registration.update(Update.of(b).withStatus(InstanceStatus.DRAINING));
            assertEquals("a", rota.pick(service).id());

            if (signal.equals("SIGTERM")) {
                // rota sends Closing on the stream, drains for its grace period and exits by itself.
                assertEquals(0, first.terminate(Duration.ofSeconds(10)));
            } else {
                first.kill();
            }
            second = RotaServer.startOn(first.target(), "--shutdown-grace", "500ms");
            assertEquals(first.target(), second.target());

            // The new server knows only what the registration announces again.
            Await.until("the instances on the new server", Duration.ofSeconds(15), () -> {
                try {
                    return rota.listInstances(service).ids().equals(List.of("a", "b"));
                } catch (RotaException e) {
                    return false;
                }
            });
            assertEquals(List.of(InstanceStatus.UP, InstanceStatus.DRAINING),
                    rota.listInstances(service).instances().stream().map(Instance::status).toList());
            Pick pick = rota.pick(service);
            assertEquals("a", pick.id());
            assertEquals(0, pick.ticket());
            assertFalse(pick.localFallback());

            registration.close();
            assertEquals(List.of(), rota.listInstances(service).instances());
            RotaException gone = assertThrows(RotaException.class, () -> rota.pick(service));
            assertEquals(Status.Code.UNAVAILABLE, gone.getCode());
        } finally {
            first.close();
            if (second != null) {
                second.close();
            }
        }
    }

    @Test
    void registerWaitsForRotaAndFailsAfterItsTimeout() throws Exception {
        RotaServer dead = RotaServer.start();
        String target = dead.target();
        dead.close();
        try (RotaClient client = RotaClient.builder().target(target).registerTimeout(Duration.ofMillis(300))
                .backoff(Backoff.exponential(Duration.ofMillis(10), Duration.ofMillis(50))).build()) {
            RotaException e = assertThrows(RotaException.class, () -> client.register(instance("it-down", "a", 7801)));
            assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getCode());

            Registration pending = client.registerAsync(List.of(instance("it-down", "a", 7801)));
            // It keeps trying, without an answer, until closed.
            Await.until("three reconnection attempts", Duration.ofSeconds(30), () -> pending.reconnects() >= 3);
            assertFalse(pending.ready().isDone());
            assertNull(pending.ack());
            pending.close();
            assertTrue(pending.ready().isCompletedExceptionally());
        }
    }
}
