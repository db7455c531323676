package io.rota.spring.cloud;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.junit.jupiter.api.Test;
import org.springframework.http.HttpMethod;
import org.springframework.mock.http.server.reactive.MockServerHttpRequest;
import org.springframework.mock.web.server.MockServerWebExchange;
import org.springframework.web.reactive.function.client.ClientRequest;
import org.springframework.web.reactive.function.client.ClientResponse;
import org.springframework.web.reactive.function.client.ExchangeFilterFunction;
import org.springframework.web.reactive.function.client.ExchangeFunction;
import org.springframework.web.reactive.function.client.WebClient;

import io.rota.client.RotaVersion;
import reactor.core.publisher.Mono;

/** WebFlux: incoming {@code X-Rota-Version} -> Reactor context -> outgoing {@code WebClient} header. */
class RotaVersionWebFluxTest {
    private final List<String> sent = new ArrayList<>();
    private final ExchangeFunction downstream = request -> {
        sent.add(request.headers().getFirst(RotaVersion.HEADER));
        return Mono.just(ClientResponse.create(org.springframework.http.HttpStatus.OK).build());
    };
    private final ExchangeFilterFunction filter = new RotaVersionExchangeFilter();

    private Mono<Void> handle(MockServerWebExchange exchange) {
        ClientRequest outgoing = ClientRequest.create(HttpMethod.GET, URI.create("http://orders/")).build();
        return new RotaVersionWebFilter().filter(exchange, e -> filter.filter(outgoing, downstream).then());
    }

    @Test
    void incomingHeaderReachesOutgoingCalls() {
        handle(MockServerWebExchange.from(MockServerHttpRequest.get("/").header("X-Rota-Version", "zlt")))
                .block(Duration.ofSeconds(5));
        handle(MockServerWebExchange.from(MockServerHttpRequest.get("/"))).block(Duration.ofSeconds(5));
        assertEquals(Arrays.asList("zlt", null), sent);
    }

    @Test
    void currentVersionAndExplicitHeaders() {
        ClientRequest plain = ClientRequest.create(HttpMethod.GET, URI.create("http://orders/")).build();
        ClientRequest explicit = ClientRequest.create(HttpMethod.GET, URI.create("http://orders/"))
                .header("X-Rota-Version", "bob").build();
        RotaVersion.run("zlt", () -> {
            filter.filter(plain, downstream).block(Duration.ofSeconds(5));
            filter.filter(explicit, downstream).block(Duration.ofSeconds(5));
        });
        filter.filter(plain, downstream).block(Duration.ofSeconds(5));
        assertEquals(Arrays.asList("zlt", "bob", null), sent);
    }

    @Test
    void postProcessorPutsTheFilterFirstOnce() {
        WebClient.Builder builder = WebClient.builder().filter((request, next) -> next.exchange(request));
        RotaVersionWebClientPostProcessor processor = new RotaVersionWebClientPostProcessor(new RotaVersionExchangeFilter());
        processor.postProcessBeforeInitialization(builder, "builder");
        processor.postProcessBeforeInitialization(builder, "builder");
        List<ExchangeFilterFunction> filters = new ArrayList<>();
        builder.filters(filters::addAll);
        assertEquals(2, filters.size());
        assertEquals(RotaVersionExchangeFilter.class, filters.get(0).getClass());
    }
}
