package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.ConnectException;
import java.time.Duration;

import org.junit.jupiter.api.Test;

import io.rota.client.testing.Await;

/** {@link RotaClient#timed} returns or rethrows the call's result and reports its outcome and latency. */
class TimedTest {
    private static final Instance A = Instance.of("svc", "127.0.0.1", 9001).withId("a");
    private static final Pick PICK = new Pick(A, 12, "repeat(n=2)", "", 3, false);

    /** The outcome of the index-th report rota received, as sent on the wire. */
    private static io.rota.v1.CallOutcome awaitOutcome(FakeRota rota, int index) throws InterruptedException {
        Await.until("report " + index, Duration.ofSeconds(40), () -> rota.reports.size() > index);
        assertEquals(1, rota.reports.get(index).getOutcomesCount());
        return rota.reports.get(index).getOutcomes(0);
    }

    @Test
    void successIsReportedOkWithItsLatency() throws Exception {
        try (FakeRota rota = new FakeRota(); RotaClient client = RotaClient.builder().target(rota.target()).callTimeout(Duration.ofSeconds(40)).build()) {
            String result = client.timed(PICK, () -> {
                long until = System.nanoTime() + Duration.ofMillis(20).toNanos();
                while (System.nanoTime() < until) {
                    Thread.onSpinWait();
                }
                return "body";
            });
            assertEquals("body", result);
            io.rota.v1.CallOutcome outcome = awaitOutcome(rota, 0);
            assertEquals("svc", outcome.getService());
            assertEquals("a", outcome.getInstanceId());
            assertEquals(12, outcome.getTicket());
            assertEquals("repeat(n=2)", outcome.getRule());
            assertEquals(io.rota.v1.CallResult.CALL_RESULT_OK, outcome.getResult());
            assertTrue(outcome.getLatencyUs() >= 20_000 && outcome.getLatencyUs() < 10_000_000, "latency " + outcome.getLatencyUs());
        }
    }

    @Test
    void failuresAreRethrownAndReported() throws Exception {
        try (FakeRota rota = new FakeRota(); RotaClient client = RotaClient.builder().target(rota.target()).callTimeout(Duration.ofSeconds(40)).build()) {
            IllegalStateException boom = new IllegalStateException("500 from the instance");
            assertSame(boom, assertThrows(IllegalStateException.class, () -> client.timed(PICK, () -> {
                throw boom;
            })));
            assertEquals(io.rota.v1.CallResult.CALL_RESULT_ERROR, awaitOutcome(rota, 0).getResult());

            IOException checked = new IOException("reset");
            assertSame(checked, assertThrows(IOException.class, () -> client.timed(PICK, () -> {
                throw checked;
            })));
            assertEquals(io.rota.v1.CallResult.CALL_RESULT_ERROR, awaitOutcome(rota, 1).getResult());

            ConnectException refused = new ConnectException("Connection refused");
            assertSame(refused, assertThrows(ConnectException.class, () -> client.timed(PICK, () -> {
                throw refused;
            })));
            assertEquals(io.rota.v1.CallResult.CALL_RESULT_CONNECT_FAILURE, awaitOutcome(rota, 2).getResult());
        }
    }

    @Test
    void classifiesByTheCauseChain() {
        assertEquals(CallResult.CONNECT_FAILURE, RotaClient.classify(new UncheckedIOException(new ConnectException("refused"))));
        assertEquals(CallResult.ERROR, RotaClient.classify(new RuntimeException(new IOException("eof"))));
        assertEquals(CallResult.ERROR, RotaClient.classify(new Error("oops")));
    }

    @Test
    void outcomeCarriesThePick() {
        CallOutcome outcome = PICK.outcome(CallResult.ERROR, Duration.ofMillis(7));
        assertEquals(new CallOutcome("svc", "a", 12, "repeat(n=2)", Duration.ofMillis(7), CallResult.ERROR), outcome);
        assertEquals(io.rota.v1.CallOutcome.newBuilder().setService("svc").setInstanceId("a").setTicket(12).setRule("repeat(n=2)")
                .setLatencyUs(7000).setResult(io.rota.v1.CallResult.CALL_RESULT_ERROR).build(), Wire.outcome(outcome));
    }
}
