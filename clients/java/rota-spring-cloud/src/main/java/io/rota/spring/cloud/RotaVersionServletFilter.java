package io.rota.spring.cloud;

import java.io.IOException;

import org.springframework.web.filter.OncePerRequestFilter;

import io.rota.client.RotaVersion;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;

/**
 * Makes the {@code X-Rota-Version} header of each incoming request the current
 * {@link RotaVersion} while the request is handled, so that picks and outgoing calls made for it
 * carry the same version.
 */
public class RotaVersionServletFilter extends OncePerRequestFilter {

    @Override
    protected void doFilterInternal(HttpServletRequest request, HttpServletResponse response, FilterChain chain)
            throws ServletException, IOException {
        String version = request.getHeader(RotaVersion.HEADER);
        if (version == null || version.isBlank()) {
            chain.doFilter(request, response);
            return;
        }
        try (RotaVersion.Scope scope = RotaVersion.open(version)) {
            chain.doFilter(request, response);
        }
    }
}
