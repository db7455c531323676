package io.rota.spring.cloud;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.net.ConnectException;
import java.net.URI;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

import org.junit.jupiter.api.Test;
import org.springframework.cloud.client.DefaultServiceInstance;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.loadbalancer.CompletionContext;
import org.springframework.cloud.client.loadbalancer.DefaultRequest;
import org.springframework.cloud.client.loadbalancer.DefaultResponse;
import org.springframework.cloud.client.loadbalancer.RequestData;
import org.springframework.cloud.client.loadbalancer.RequestDataContext;
import org.springframework.cloud.client.loadbalancer.ResponseData;
import org.springframework.http.HttpHeaders;
import org.springframework.http.HttpMethod;
import org.springframework.http.HttpStatus;
import org.springframework.util.LinkedMultiValueMap;

import io.rota.client.CallOutcome;
import io.rota.client.CallResult;

class RotaOutcomeReporterTest {
    private static final RequestData DATA = new RequestData(HttpMethod.GET, URI.create("http://orders/"), new HttpHeaders(),
            new LinkedMultiValueMap<>(), new HashMap<>());

    private static ServiceInstance picked(Map<String, String> extra) {
        Map<String, String> metadata = new HashMap<>(Map.of(RotaLoadBalancer.TICKET, "17", RotaLoadBalancer.RULE, "repeat(n=2)"));
        metadata.putAll(extra);
        return new DefaultServiceInstance("a", "orders", "127.0.0.1", 9001, false, metadata);
    }

    private static DefaultRequest<Object> startedAt(long nanos) {
        RequestDataContext context = new RequestDataContext(DATA);
        context.setRequestStartTime(nanos);
        return new DefaultRequest<>(context);
    }

    @Test
    void successIsOkWithTheLatencyAndThePick() {
        CompletionContext<Object, ServiceInstance, Object> done = new CompletionContext<>(CompletionContext.Status.SUCCESS,
                startedAt(1_000_000), new DefaultResponse(picked(Map.of())),
                new ResponseData(HttpStatus.OK, new HttpHeaders(), new LinkedMultiValueMap<>(), DATA));
        CallOutcome outcome = RotaOutcomeReporter.outcome(done, 43_000_000);
        assertEquals(new CallOutcome("orders", "a", 17, "repeat(n=2)", Duration.ofMillis(42), CallResult.OK), outcome);
    }

    @Test
    void serverErrorsAndFailuresAreClassified() {
        CompletionContext<Object, ServiceInstance, Object> fiveHundred = new CompletionContext<>(CompletionContext.Status.SUCCESS,
                startedAt(1), new DefaultResponse(picked(Map.of())),
                new ResponseData(HttpStatus.SERVICE_UNAVAILABLE, new HttpHeaders(), new LinkedMultiValueMap<>(), DATA));
        assertEquals(CallResult.ERROR, RotaOutcomeReporter.outcome(fiveHundred, 2).result());
        CompletionContext<Object, ServiceInstance, Object> notFound = new CompletionContext<>(CompletionContext.Status.SUCCESS,
                startedAt(1), new DefaultResponse(picked(Map.of())),
                new ResponseData(HttpStatus.NOT_FOUND, new HttpHeaders(), new LinkedMultiValueMap<>(), DATA));
        assertEquals(CallResult.OK, RotaOutcomeReporter.outcome(notFound, 2).result());
        CompletionContext<Object, ServiceInstance, Object> refused = new CompletionContext<>(CompletionContext.Status.FAILED,
                new IllegalStateException(new ConnectException("refused")), startedAt(1), new DefaultResponse(picked(Map.of())));
        assertEquals(CallResult.CONNECT_FAILURE, RotaOutcomeReporter.outcome(refused, 2).result());
        CompletionContext<Object, ServiceInstance, Object> failed = new CompletionContext<>(CompletionContext.Status.FAILED,
                new IllegalStateException("boom"), startedAt(1), new DefaultResponse(picked(Map.of())));
        assertEquals(CallResult.ERROR, RotaOutcomeReporter.outcome(failed, 2).result());
    }

    @Test
    void nothingIsReportedWithoutARotaPick() {
        assertNull(RotaOutcomeReporter.outcome(new CompletionContext<>(CompletionContext.Status.DISCARD, startedAt(1)), 2));
        ServiceInstance local = picked(Map.of(RotaLoadBalancer.LOCAL_FALLBACK, "true"));
        assertNull(RotaOutcomeReporter.outcome(new CompletionContext<>(CompletionContext.Status.SUCCESS, startedAt(1),
                new DefaultResponse(local)), 2));
        ServiceInstance foreign = new DefaultServiceInstance("x", "orders", "127.0.0.1", 1, false);
        assertNull(RotaOutcomeReporter.outcome(new CompletionContext<>(CompletionContext.Status.SUCCESS, startedAt(1),
                new DefaultResponse(foreign)), 2));
    }
}
