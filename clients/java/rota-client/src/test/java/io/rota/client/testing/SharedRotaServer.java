package io.rota.client.testing;

import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.ParameterContext;
import org.junit.jupiter.api.extension.ParameterResolver;

/**
 * A JUnit extension giving tests one {@link RotaServer} shared by every test of the run; it is
 * killed when the run ends, whether tests passed or not.
 *
 * <pre>{@code
 * @ExtendWith(SharedRotaServer.class)
 * class SomeTest {
 *     @Test
 *     void picks(RotaServer rota) { ... }
 * }
 * }</pre>
 *
 * <p>Where no parameter can be injected (Spring's {@code @DynamicPropertySource}),
 * {@link #server()} returns it once a class using the extension has started.
 */
public final class SharedRotaServer implements ParameterResolver, BeforeAllCallback {
    private static final ExtensionContext.Namespace NAMESPACE = ExtensionContext.Namespace.create(SharedRotaServer.class);
    private static volatile RotaServer started;

    @Override
    public void beforeAll(ExtensionContext context) {
        get(context);
    }

    @Override
    public boolean supportsParameter(ParameterContext parameter, ExtensionContext context) {
        return parameter.getParameter().getType() == RotaServer.class;
    }

    @Override
    public Object resolveParameter(ParameterContext parameter, ExtensionContext context) {
        return get(context);
    }

    /** The shared server, started on first use. */
    public static RotaServer get(ExtensionContext context) {
        RotaServer server = context.getRoot().getStore(NAMESPACE)
                .getOrComputeIfAbsent("server", key -> new Resource(), Resource.class).server;
        started = server;
        return server;
    }

    /** The shared server of this run, for code that has no {@link ExtensionContext}. */
    public static RotaServer server() {
        RotaServer server = started;
        if (server == null) {
            throw new IllegalStateException("no shared rota server yet: add @ExtendWith(SharedRotaServer.class)");
        }
        return server;
    }

    private static final class Resource implements ExtensionContext.Store.CloseableResource {
        final RotaServer server;

        Resource() {
            try {
                server = RotaServer.start();
            } catch (Exception e) {
                throw new IllegalStateException("cannot start rota", e);
            }
        }

        @Override
        public void close() throws Exception {
            started = null;
            server.close();
        }
    }
}
