package io.rota.client.testing;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A {@code rota serve} process for tests, on a free loopback port.
 *
 * <p>The binary is {@code -Drota.bin}, else the {@code ROTA_BIN} environment variable, else
 * {@code target/debug/rota} of the repository after {@code cargo build --bin rota}. The process is
 * started as {@code rota serve --listen 127.0.0.1:0} with {@code ROTA_WARMUP=0s} in its environment
 * (a {@code --warmup} argument wins); the port is read from the first line of its
 * standard output ({@code listening on 127.0.0.1:PORT}); with its admin listener on
 * ({@link #startWithAdminOn}), the admin address from the second ({@code admin on ADDR}). Its log goes to
 * {@code target/rota-logs/}. {@link #close()} kills it; a shutdown hook does too if the JVM
 * ends first.
 */
public final class RotaServer implements AutoCloseable {
    private static final Pattern LISTENING = Pattern.compile("^listening on (\\S+):(\\d+)\\s*$");
    private static final Pattern ADMIN = Pattern.compile("^admin on (\\S+)\\s*$");
    private static final long START_TIMEOUT_SECONDS = 30;
    private static final long BUILD_TIMEOUT_MINUTES = 15;
    private static final AtomicInteger COUNT = new AtomicInteger();
    private static Path binary;

    private final Process process;
    private final String host;
    private final int port;
    private final Path log;
    private final String admin;
    private final Thread hook;

    private RotaServer(Process process, String host, int port, Path log, String admin) {
        this.process = process;
        this.host = host;
        this.port = port;
        this.log = log;
        this.admin = admin;
        this.hook = new Thread(process::destroyForcibly, "rota-server-kill");
        Runtime.getRuntime().addShutdownHook(hook);
    }

    /** Starts {@code rota serve --listen 127.0.0.1:0 ARGS...} and waits for its port. */
    public static RotaServer start(String... args) throws IOException, InterruptedException {
        return startOn("127.0.0.1:0", args);
    }

    /**
     * Starts {@code rota serve --listen LISTEN ARGS...} and waits for its port; {@code listen} is a
     * loopback address, e.g. the {@link #target()} of a server that was stopped, to restart on its port.
     */
    public static RotaServer startOn(String listen, String... args) throws IOException, InterruptedException {
        return launch(listen, false, args);
    }

    /**
     * {@link #startOn} with rota's admin listener on a free loopback port
     * ({@code ROTA_ADMIN_LISTEN=127.0.0.1:0}), whose address {@link #admin()} gives.
     */
    public static RotaServer startWithAdminOn(String listen, String... args) throws IOException, InterruptedException {
        return launch(listen, true, args);
    }

    private static RotaServer launch(String listen, boolean withAdmin, String... args) throws IOException, InterruptedException {
        List<String> command = new ArrayList<>(List.of(binary().toString(), "serve", "--listen", listen));
        command.addAll(List.of(args));
        Path logs = Paths.get(System.getProperty("user.dir"), "target", "rota-logs");
        Files.createDirectories(logs);
        Path log = logs.resolve("rota-" + ProcessHandle.current().pid() + "-" + COUNT.incrementAndGet() + ".log");
        ProcessBuilder builder = new ProcessBuilder(command);
        // No start-up warm-up unless a test asks for one (--warmup wins over the variable): a
        // fresh test server has seen no service, and tests expect NOT_FOUND for one never registered.
        builder.environment().put("ROTA_WARMUP", "0s");
        if (withAdmin) {
            builder.environment().put("ROTA_ADMIN_LISTEN", "127.0.0.1:0");
        }
        Process process = builder
                .redirectError(log.toFile())
                .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")))
                .start();
        try {
            BufferedReader stdout = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
            // rota writes both lines at once, so a reader never waits for the second alone.
            CompletableFuture<String[]> firstLines = CompletableFuture.supplyAsync(() -> {
                try {
                    String first = stdout.readLine();
                    return new String[] {first, withAdmin && first != null ? stdout.readLine() : null};
                } catch (IOException e) {
                    throw new IllegalStateException(e);
                }
            });
            String[] lines = firstLines.get(START_TIMEOUT_SECONDS, TimeUnit.SECONDS);
            String line = lines[0];
            if (line == null) {
                throw new IllegalStateException("rota exited before listening (exit " + process.waitFor() + "), log: "
                        + Files.readString(log));
            }
            Matcher m = LISTENING.matcher(line);
            if (!m.matches()) {
                throw new IllegalStateException("unexpected first line from rota: " + line);
            }
            String admin = null;
            if (withAdmin) {
                Matcher a = ADMIN.matcher(String.valueOf(lines[1]));
                if (!a.matches()) {
                    throw new IllegalStateException("unexpected second line from rota: " + lines[1] + ", log: " + Files.readString(log));
                }
                admin = a.group(1);
            }
            Thread drain = new Thread(() -> {
                try {
                    while (stdout.readLine() != null) {
                        // rota prints nothing else on stdout; keep the pipe from filling regardless.
                    }
                } catch (IOException ignored) {
                    // the process is gone
                }
            }, "rota-server-stdout");
            drain.setDaemon(true);
            drain.start();
            return new RotaServer(process, m.group(1), Integer.parseInt(m.group(2)), log, admin);
        } catch (Exception e) {
            process.destroyForcibly();
            process.waitFor(10, TimeUnit.SECONDS);
            if (e instanceof TimeoutException) {
                throw new IllegalStateException("rota did not print its address within " + START_TIMEOUT_SECONDS + " s", e);
            }
            if (e instanceof RuntimeException r) {
                throw r;
            }
            throw new IllegalStateException(e);
        }
    }

    /** {@code host:port} to give {@code RotaClient.builder().target(...)}. */
    public String target() {
        return host + ":" + port;
    }

    /** {@code host:port} of its admin (HTTP) listener; only for a server started with it on. */
    public String admin() {
        if (admin == null) {
            throw new IllegalStateException("this rota was started without its admin listener");
        }
        return admin;
    }

    public int port() {
        return port;
    }

    public Path log() {
        return log;
    }

    public boolean isAlive() {
        return process.isAlive();
    }

    /**
     * Asks the process to stop (SIGTERM: rota drains for its grace period, then exits) and waits
     * for it; returns its exit code. Kills it if it is still running after {@code timeout}.
     */
    public int terminate(Duration timeout) throws InterruptedException {
        process.destroy();
        if (!process.waitFor(timeout.toMillis(), TimeUnit.MILLISECONDS)) {
            kill();
            throw new IllegalStateException("rota did not exit within " + timeout.toMillis() + " ms of SIGTERM");
        }
        return process.exitValue();
    }

    /** Kills the process at once (SIGKILL) and waits for it to be gone. */
    public void kill() throws InterruptedException {
        process.destroyForcibly();
        if (!process.waitFor(10, TimeUnit.SECONDS)) {
            throw new IllegalStateException("rota did not die within 10 s");
        }
    }

    @Override
    public void close() {
        try {
            kill();
        } catch (InterruptedException e) {
            process.destroyForcibly();
            Thread.currentThread().interrupt();
        }
        try {
            Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException ignored) {
            // the JVM is already shutting down
        }
    }

    /** The rota binary, building it with cargo when neither {@code rota.bin} nor {@code ROTA_BIN} names one. */
    public static synchronized Path binary() throws IOException, InterruptedException {
        if (binary != null) {
            return binary;
        }
        String configured = System.getProperty("rota.bin");
        if (configured == null || configured.isBlank()) {
            configured = System.getenv("ROTA_BIN");
        }
        if (configured != null && !configured.isBlank()) {
            Path path = Paths.get(configured);
            if (!Files.isExecutable(path)) {
                throw new IllegalStateException("ROTA_BIN is not an executable file: " + path);
            }
            binary = path;
            return binary;
        }
        Path root = repositoryRoot();
        Path logs = Paths.get(System.getProperty("user.dir"), "target", "rota-logs");
        Files.createDirectories(logs);
        Path log = logs.resolve("cargo-build-" + ProcessHandle.current().pid() + ".log");
        Process cargo = new ProcessBuilder("cargo", "build", "--bin", "rota")
                .directory(root.toFile())
                .redirectErrorStream(true)
                .redirectOutput(log.toFile())
                .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")))
                .start();
        if (!cargo.waitFor(BUILD_TIMEOUT_MINUTES, TimeUnit.MINUTES)) {
            cargo.destroyForcibly();
            throw new IllegalStateException("cargo build --bin rota took more than " + BUILD_TIMEOUT_MINUTES
                    + " min; see " + log);
        }
        if (cargo.exitValue() != 0) {
            throw new IllegalStateException("cargo build --bin rota failed with exit " + cargo.exitValue() + ":\n"
                    + Files.readString(log));
        }
        String targetDir = System.getenv("CARGO_TARGET_DIR");
        Path target = targetDir != null && !targetDir.isBlank() ? root.resolve(targetDir) : root.resolve("target");
        binary = target.resolve("debug").resolve("rota");
        return binary;
    }

    /** The repository root: {@code -Drota.repo}, else the nearest ancestor holding {@code proto/rota/v1/rota.proto}. */
    public static Path repositoryRoot() {
        String configured = System.getProperty("rota.repo");
        if (configured != null && !configured.isBlank()) {
            Path root = Paths.get(configured).toAbsolutePath().normalize();
            if (Files.exists(root.resolve("proto/rota/v1/rota.proto"))) {
                return root;
            }
        }
        for (Path dir = Paths.get(System.getProperty("user.dir")).toAbsolutePath(); dir != null; dir = dir.getParent()) {
            if (Files.exists(dir.resolve("proto/rota/v1/rota.proto"))) {
                return dir;
            }
        }
        throw new IllegalStateException("cannot find the rota repository above " + System.getProperty("user.dir"));
    }

    @Override
    public String toString() {
        return "RotaServer{" + target() + "}";
    }
}
