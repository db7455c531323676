package io.rota.spring.cloud;

import java.util.List;

import org.springframework.web.reactive.function.client.ClientRequest;
import org.springframework.web.reactive.function.client.ClientResponse;
import org.springframework.web.reactive.function.client.ExchangeFilterFunction;
import org.springframework.web.reactive.function.client.ExchangeFunction;

import io.rota.client.RotaVersion;
import reactor.core.publisher.Mono;

/**
 * {@code WebClient}: adds the version of the call chain as the {@code X-Rota-Version} header of
 * each outgoing request that has none. The version is the Reactor context's
 * {@link RotaVersionWebFilter#CONTEXT_KEY}, else the current {@link RotaVersion}. Installed first
 * in the filter chain, so that the load balancer's filter sees the header when it picks.
 */
public class RotaVersionExchangeFilter implements ExchangeFilterFunction {

    @Override
    public Mono<ClientResponse> filter(ClientRequest request, ExchangeFunction next) {
        if (request.headers().containsKey(RotaVersion.HEADER)) {
            return next.exchange(request);
        }
        String current = RotaVersion.current().orElse(null);
        return Mono.deferContextual(context -> {
            String version = context.getOrDefault(RotaVersionWebFilter.CONTEXT_KEY, current);
            if (version == null) {
                return next.exchange(request);
            }
            return next.exchange(ClientRequest.from(request).header(RotaVersion.HEADER, version).build());
        });
    }

    /** Puts {@code filter} first in {@code filters} unless one is there already. */
    static void installFirst(List<ExchangeFilterFunction> filters, RotaVersionExchangeFilter filter) {
        if (filters.stream().noneMatch(RotaVersionExchangeFilter.class::isInstance)) {
            filters.add(0, filter);
        }
    }
}
