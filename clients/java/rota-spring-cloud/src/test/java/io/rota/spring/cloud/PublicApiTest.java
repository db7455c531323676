package io.rota.spring.cloud;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;

import org.junit.jupiter.api.Test;

import io.rota.client.testing.PublicApi;

/** The Spring module speaks the client's model: no type generated from the proto in its public API. */
class PublicApiTest {
    @Test
    void exposesNoGeneratedType() throws Exception {
        assertEquals(List.of(), PublicApi.uses(RotaLoadBalancer.class, "io.rota.v1."));
    }
}
