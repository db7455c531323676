package io.rota.examples.provider;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;

import com.sun.net.httpserver.HttpServer;

import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.RotaVersion;

/**
 * A plain Java HTTP service that registers itself with rota for as long as it runs.
 *
 * <pre>
 * java -cp ... io.rota.examples.provider.ProviderApp [rota-target] [service] [port] [version]
 * </pre>
 *
 * Defaults: {@code 127.0.0.1:50051 hello-provider 8081 ""}. Each answer names the instance and the
 * version the request asked for ({@code X-Rota-Version}).
 */
public final class ProviderApp {
    private ProviderApp() {
    }

    public static void main(String[] args) throws IOException, InterruptedException {
        String target = args.length > 0 ? args[0] : RotaClient.DEFAULT_TARGET;
        String service = args.length > 1 ? args[1] : "hello-provider";
        int port = args.length > 2 ? Integer.parseInt(args[2]) : 8081;
        String version = args.length > 3 ? args[3] : "";
        String id = "provider-" + port;

        HttpServer http = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 0);
        http.createContext("/", exchange -> {
            String asked = exchange.getRequestHeaders().getFirst(RotaVersion.HEADER);
            byte[] body = ("hello from " + id + " (version asked: " + (asked == null ? "none" : asked) + ")\n")
                    .getBytes(StandardCharsets.UTF_8);
            exchange.sendResponseHeaders(200, body.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(body);
            }
        });
        http.start();

        Instance instance = Instance.of(service, "127.0.0.1", http.getAddress().getPort()).withId(id).withVersion(version);

        RotaClient rota = RotaClient.builder().target(target).build();
        // Registers in the background: the service starts even while rota is down, and the
        // registration reconnects (and announces again) whenever rota comes back.
        Registration registration = rota.registerAsync(java.util.List.of(instance));
        registration.ready().thenAccept(ack -> System.out.println("registered " + service + "/" + id + " with rota"));

        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            registration.close(); // withdraw first, so that no new pick sends traffic here
            rota.close();
            http.stop(1);
            stopped.countDown();
        }));
        System.out.println("serving " + service + " on http://127.0.0.1:" + http.getAddress().getPort() + "/");
        stopped.await();
    }
}
