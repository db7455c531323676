package io.rota.spring.cloud;

import org.springframework.core.Ordered;
import org.springframework.web.server.ServerWebExchange;
import org.springframework.web.server.WebFilter;
import org.springframework.web.server.WebFilterChain;

import io.rota.client.RotaVersion;
import reactor.core.publisher.Mono;

/**
 * WebFlux: puts the {@code X-Rota-Version} header of each incoming request into the Reactor
 * context under {@link #CONTEXT_KEY}, where {@link RotaVersionExchangeFilter} finds it for the
 * outgoing {@code WebClient} calls made while handling the request.
 */
public class RotaVersionWebFilter implements WebFilter, Ordered {
    /** The Reactor context key holding the version of the request being handled. */
    public static final String CONTEXT_KEY = "rota.version";

    @Override
    public Mono<Void> filter(ServerWebExchange exchange, WebFilterChain chain) {
        String version = exchange.getRequest().getHeaders().getFirst(RotaVersion.HEADER);
        if (version == null || version.isBlank()) {
            return chain.filter(exchange);
        }
        String trimmed = version.trim();
        return chain.filter(exchange).contextWrite(context -> context.put(CONTEXT_KEY, trimmed));
    }

    @Override
    public int getOrder() {
        return Ordered.HIGHEST_PRECEDENCE + 100;
    }
}
