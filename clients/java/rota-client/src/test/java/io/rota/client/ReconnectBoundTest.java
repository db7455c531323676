package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Test;

import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.rota.client.testing.Await;

/** The channel is told to reconnect after the client's own backoff, not grpc-java's (up to 120 s). */
class ReconnectBoundTest {
    /** A channel whose connectivity the test drives. */
    private static final class ScriptedChannel extends ManagedChannel {
        private ConnectivityState state = ConnectivityState.IDLE;
        private final List<Runnable> listeners = new ArrayList<>();
        int resets;

        synchronized void become(ConnectivityState next) {
            state = next;
            List<Runnable> waiting = new ArrayList<>(listeners);
            listeners.clear();
            waiting.forEach(Runnable::run);
        }

        synchronized int listeners() {
            return listeners.size();
        }

        synchronized int resets() {
            return resets;
        }

        @Override
        public synchronized ConnectivityState getState(boolean requestConnection) {
            return state;
        }

        @Override
        public synchronized void notifyWhenStateChanged(ConnectivityState source, Runnable callback) {
            if (source != state) {
                callback.run();
            } else {
                listeners.add(callback);
            }
        }

        @Override
        public synchronized void resetConnectBackoff() {
            resets++;
        }

        @Override
        public ManagedChannel shutdown() {
            return this;
        }

        @Override
        public boolean isShutdown() {
            return false;
        }

        @Override
        public boolean isTerminated() {
            return false;
        }

        @Override
        public ManagedChannel shutdownNow() {
            return this;
        }

        @Override
        public boolean awaitTermination(long timeout, TimeUnit unit) {
            return true;
        }

        @Override
        public <Q, R> ClientCall<Q, R> newCall(MethodDescriptor<Q, R> method, CallOptions options) {
            throw new UnsupportedOperationException();
        }

        @Override
        public String authority() {
            return "scripted";
        }
    }

    @Test
    void aChannelInTransientFailureIsToldToReconnectAfterTheClientsBackoff() throws Exception {
        ScheduledExecutorService scheduler = Executors.newSingleThreadScheduledExecutor();
        ScriptedChannel channel = new ScriptedChannel();
        ReconnectBound bound = new ReconnectBound(channel, scheduler,
                Backoff.exponential(Duration.ofMillis(1), Duration.ofMillis(5)));
        try {
            bound.start();
            assertEquals(1, channel.listeners());
            channel.become(ConnectivityState.CONNECTING);
            assertEquals(0, channel.resets());
            for (int failure = 1; failure <= 3; failure++) {
                channel.become(ConnectivityState.TRANSIENT_FAILURE);
                int expected = failure;
                Await.until("reset number " + failure, Duration.ofSeconds(20), () -> channel.resets() == expected);
                channel.become(ConnectivityState.CONNECTING);
            }
            // A channel that recovered on its own in the meantime is left alone: the scheduler is
            // held until the channel is READY, then runs the reset it had due before a later task.
            CountDownLatch hold = new CountDownLatch(1);
            scheduler.submit(() -> hold.await(20, TimeUnit.SECONDS));
            channel.become(ConnectivityState.TRANSIENT_FAILURE);
            channel.become(ConnectivityState.READY);
            hold.countDown();
            scheduler.schedule(() -> { }, 10, TimeUnit.MILLISECONDS).get(20, TimeUnit.SECONDS);
            assertEquals(3, channel.resets());
            assertTrue(channel.listeners() == 1, "still watching the channel");

            bound.close();
            channel.become(ConnectivityState.TRANSIENT_FAILURE);
            assertEquals(0, channel.listeners());
        } finally {
            scheduler.shutdownNow();
        }
    }
}
