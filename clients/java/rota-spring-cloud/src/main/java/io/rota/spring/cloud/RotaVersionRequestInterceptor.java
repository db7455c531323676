package io.rota.spring.cloud;

import java.io.IOException;
import java.util.List;

import org.springframework.core.Ordered;
import org.springframework.http.HttpRequest;
import org.springframework.http.client.ClientHttpRequestExecution;
import org.springframework.http.client.ClientHttpRequestInterceptor;
import org.springframework.http.client.ClientHttpResponse;

import io.rota.client.RotaVersion;

/**
 * {@code RestTemplate} / {@code RestClient}: adds the current {@link RotaVersion} as the
 * {@code X-Rota-Version} header of each outgoing request that has none. Installed first in the
 * chain, so that the load balancer's interceptor sees the header when it picks.
 */
public class RotaVersionRequestInterceptor implements ClientHttpRequestInterceptor, Ordered {

    /** First, also where interceptors are sorted by order ({@code RestTemplate}). */
    @Override
    public int getOrder() {
        return Ordered.HIGHEST_PRECEDENCE;
    }

    @Override
    public ClientHttpResponse intercept(HttpRequest request, byte[] body, ClientHttpRequestExecution execution)
            throws IOException {
        if (!request.getHeaders().containsKey(RotaVersion.HEADER)) {
            RotaVersion.current().ifPresent(version -> request.getHeaders().set(RotaVersion.HEADER, version));
        }
        return execution.execute(request, body);
    }

    /** Puts {@code interceptor} first in {@code interceptors} unless one is there already. */
    static void installFirst(List<ClientHttpRequestInterceptor> interceptors, RotaVersionRequestInterceptor interceptor) {
        if (interceptors.stream().noneMatch(RotaVersionRequestInterceptor.class::isInstance)) {
            interceptors.add(0, interceptor);
        }
    }
}
