package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import org.junit.jupiter.api.Test;

import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.stub.MetadataUtils;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.PickRequest;

/** An incoming {@code x-rota-version} becomes the current version, which the next pick and outgoing calls carry. */
class VersionPropagationTest {
    private static final Instance A = Instance.of("svc", "127.0.0.1", 9001).withId("a");

    @Test
    void currentVersionIsScoped() {
        assertEquals(Optional.empty(), RotaVersion.current());
        try (RotaVersion.Scope outer = RotaVersion.open("zlt")) {
            assertEquals(Optional.of("zlt"), RotaVersion.current());
            try (RotaVersion.Scope inner = RotaVersion.open("  bob ")) {
                assertEquals(Optional.of("bob"), RotaVersion.current());
            }
            try (RotaVersion.Scope none = RotaVersion.open("")) {
                assertEquals(Optional.empty(), RotaVersion.current());
            }
            assertEquals(Optional.of("zlt"), RotaVersion.current());
        }
        assertEquals(Optional.empty(), RotaVersion.current());
    }

    @Test
    void wrappedTasksCarryTheVersionToOtherThreads() throws Exception {
        ExecutorService executor = Executors.newSingleThreadExecutor();
        try {
            CompletableFuture<Optional<String>> seen = new CompletableFuture<>();
            RotaVersion.run("zlt", () -> executor.execute(RotaVersion.wrap(() -> seen.complete(RotaVersion.current()))));
            assertEquals(Optional.of("zlt"), seen.get());
            CompletableFuture<Optional<String>> unwrapped = new CompletableFuture<>();
            RotaVersion.run("zlt", () -> executor.execute(() -> unwrapped.complete(RotaVersion.current())));
            assertEquals(Optional.empty(), unwrapped.get());
        } finally {
            executor.shutdownNow();
        }
    }

    @Test
    void picksUseTheCurrentVersionUnlessOneIsGiven() throws Exception {
        try (FakeRota rota = new FakeRota(); RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            rota.onPick = request -> FakeRota.answer(A, 0);
            client.pick("svc");
            RotaVersion.run("zlt", () -> {
                client.pick("svc");
                client.pick("svc", PickOptions.builder().version("bob").build());
                client.pick("svc", PickOptions.builder().version("").build());
                client.pick("svc", PickOptions.defaults());
                client.pick("svc", PickOptions.builder().version("v2").build());
            });
            CompletableFuture<Pick> async;
            try (RotaVersion.Scope scope = RotaVersion.open("async")) {
                async = client.pickAsync("svc", PickOptions.rule("random"));
            }
            async.join();
            assertEquals(List.of("", "zlt", "bob", "", "zlt", "v2", "async"),
                    rota.picks.stream().map(PickRequest::getVersion).toList());
            assertEquals("random", rota.picks.get(6).getRule());
        }
    }

    @Test
    void incomingHeaderFollowsTheCallChain() throws Exception {
        // rota <- service B (picks while handling a call) <- caller with x-rota-version: zlt
        try (FakeRota rota = new FakeRota(); RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            rota.onPick = request -> FakeRota.answer(A, 0);
            try (FakeRota serviceB = new FakeRota(RotaVersion.serverInterceptor())) {
                serviceB.onPick = request -> {
                    Pick downstream = client.pick("svc");
                    return FakeRota.answer(downstream.instance(), 0);
                };
                ManagedChannel channel = Grpc.newChannelBuilder(serviceB.target(), InsecureChannelCredentials.create()).build();
                try {
                    Metadata headers = new Metadata();
                    headers.put(RotaVersion.METADATA_KEY, "zlt");
                    BalancerGrpc.newBlockingStub(channel)
                            .withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers))
                            .pick(PickRequest.newBuilder().setService("b").build());
                    BalancerGrpc.newBlockingStub(channel).pick(PickRequest.newBuilder().setService("b").build());
                } finally {
                    channel.shutdownNow();
                }
            }
            assertEquals(List.of("zlt", ""), rota.picks.stream().map(PickRequest::getVersion).toList());
        }
    }

    @Test
    void clientInterceptorForwardsTheCurrentVersion() throws Exception {
        try (FakeRota rota = new FakeRota(); RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            rota.onPick = request -> FakeRota.answer(A, 0);
            // service B reads the header and picks; the caller forwards its own current version.
            try (FakeRota serviceB = new FakeRota(RotaVersion.serverInterceptor())) {
                serviceB.onPick = request -> FakeRota.answer(client.pick("svc").instance(), 0);
                ManagedChannel channel = Grpc.newChannelBuilder(serviceB.target(), InsecureChannelCredentials.create())
                        .intercept(RotaVersion.clientInterceptor()).build();
                try {
                    BalancerGrpc.BalancerBlockingStub stub = BalancerGrpc.newBlockingStub(channel);
                    RotaVersion.run("zlt", () -> stub.pick(PickRequest.newBuilder().setService("b").build()));
                    stub.pick(PickRequest.newBuilder().setService("b").build());
                    Metadata explicit = new Metadata();
                    explicit.put(RotaVersion.METADATA_KEY, "bob");
                    RotaVersion.run("zlt", () -> stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(explicit))
                            .pick(PickRequest.newBuilder().setService("b").build()));
                } finally {
                    channel.shutdownNow();
                }
            }
            assertEquals(List.of("zlt", "", "bob"), rota.picks.stream().map(PickRequest::getVersion).toList());
        }
    }
}
