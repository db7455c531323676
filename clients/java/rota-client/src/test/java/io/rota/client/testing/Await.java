package io.rota.client.testing;

import java.time.Duration;
import java.util.function.BooleanSupplier;

/** Waits for a condition with a bounded deadline (polling), for state owned by another process or thread. */
public final class Await {
    private Await() {
    }

    public static void until(String what, Duration timeout, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out after " + timeout.toMillis() + " ms waiting for " + what);
            }
            Thread.sleep(10);
        }
    }
}
