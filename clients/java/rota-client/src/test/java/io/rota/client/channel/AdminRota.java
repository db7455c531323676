package io.rota.client.channel;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import io.rota.client.testing.RotaServer;

/**
 * A {@code rota serve} for the channel scenarios with its admin listener on: started as
 * {@code rota serve --listen LISTEN} with {@code ROTA_ADMIN_LISTEN=127.0.0.1:0} and
 * {@code ROTA_WARMUP=0s}; the bound address is read from the first line of its standard output
 * ({@code listening on ADDR}), the admin address from the second ({@code admin on ADDR}). The
 * binary is {@link RotaServer#binary()}; the log goes to {@code target/rota-logs/}. {@link #close()}
 * kills it, as does a shutdown hook if the JVM ends first.
 */
final class AdminRota implements AutoCloseable {
    private static final Pattern LISTENING = Pattern.compile("^listening on (\\S+)\\s*$");
    private static final Pattern ADMIN = Pattern.compile("^admin on (\\S+)\\s*$");
    private static final long START_TIMEOUT_SECONDS = 30;
    private static final AtomicInteger COUNT = new AtomicInteger();

    private final Process process;
    private final String target;
    private final String admin;
    private final Thread hook;

    private AdminRota(Process process, String target, String admin) {
        this.process = process;
        this.target = target;
        this.admin = admin;
        this.hook = new Thread(process::destroyForcibly, "rota-admin-server-kill");
        Runtime.getRuntime().addShutdownHook(hook);
    }

    /** Starts rota on a free loopback port. */
    static AdminRota start() throws IOException, InterruptedException {
        return startOn("127.0.0.1:0");
    }

    /** Starts rota on {@code listen}, e.g. the {@link #target()} of a stopped one, to restart on its port. */
    static AdminRota startOn(String listen) throws IOException, InterruptedException {
        Path logs = Paths.get(System.getProperty("user.dir"), "target", "rota-logs");
        Files.createDirectories(logs);
        Path log = logs.resolve("rota-admin-" + ProcessHandle.current().pid() + "-" + COUNT.incrementAndGet() + ".log");
        ProcessBuilder builder = new ProcessBuilder(RotaServer.binary().toString(), "serve", "--listen", listen);
        builder.environment().put("ROTA_ADMIN_LISTEN", "127.0.0.1:0");
        builder.environment().put("ROTA_WARMUP", "0s");
        Process process = builder.redirectError(log.toFile())
                .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")))
                .start();
        try {
            BufferedReader stdout = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
            CompletableFuture<String[]> lines = CompletableFuture.supplyAsync(() -> {
                try {
                    return new String[] {stdout.readLine(), stdout.readLine()};
                } catch (IOException e) {
                    throw new IllegalStateException(e);
                }
            });
            String[] read = lines.get(START_TIMEOUT_SECONDS, TimeUnit.SECONDS);
            Matcher listening = LISTENING.matcher(String.valueOf(read[0]));
            Matcher admin = ADMIN.matcher(String.valueOf(read[1]));
            if (!listening.matches() || !admin.matches()) {
                throw new IllegalStateException("rota printed " + read[0] + " / " + read[1]
                        + " (exit " + (process.isAlive() ? "none yet" : process.exitValue()) + "), log: " + Files.readString(log));
            }
            Thread drain = new Thread(() -> {
                try {
                    while (stdout.readLine() != null) {
                        // rota prints nothing else on stdout; keep the pipe from filling regardless.
                    }
                } catch (IOException ignored) {
                    // the process is gone
                }
            }, "rota-admin-server-stdout");
            drain.setDaemon(true);
            drain.start();
            return new AdminRota(process, listening.group(1), admin.group(1));
        } catch (Exception e) {
            process.destroyForcibly();
            process.waitFor(10, TimeUnit.SECONDS);
            if (e instanceof TimeoutException) {
                throw new IllegalStateException("rota did not print its addresses within " + START_TIMEOUT_SECONDS + " s", e);
            }
            if (e instanceof RuntimeException r) {
                throw r;
            }
            throw new IllegalStateException(e);
        }
    }

    /** {@code host:port} of its gRPC listener. */
    String target() {
        return target;
    }

    /** {@code host:port} of its admin listener (HTTP). */
    String admin() {
        return admin;
    }

    /** Kills the process at once (SIGKILL) and waits for it to be gone. */
    void kill() throws InterruptedException {
        process.destroyForcibly();
        if (!process.waitFor(10, TimeUnit.SECONDS)) {
            throw new IllegalStateException("rota did not die within 10 s");
        }
    }

    @Override
    public void close() throws InterruptedException {
        kill();
        try {
            Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException ignored) {
            // the JVM is already shutting down
        }
    }
}
