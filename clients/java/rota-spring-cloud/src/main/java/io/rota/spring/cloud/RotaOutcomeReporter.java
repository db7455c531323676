package io.rota.spring.cloud;

import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.Map;

import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.loadbalancer.CompletionContext;
import org.springframework.cloud.client.loadbalancer.LoadBalancerLifecycle;
import org.springframework.cloud.client.loadbalancer.Request;
import org.springframework.cloud.client.loadbalancer.Response;
import org.springframework.cloud.client.loadbalancer.ResponseData;
import org.springframework.cloud.client.loadbalancer.TimedRequestContext;
import org.springframework.http.HttpStatusCode;
import org.springframework.http.client.ClientHttpResponse;

import io.rota.client.CallOutcome;
import io.rota.client.CallResult;
import io.rota.client.RotaClient;

/**
 * Reports the outcome and latency of each load-balanced call to rota (in the background), so
 * that rota's statistics see what its picks led to. A 5xx answer counts as an error; a failure to
 * connect as a connect failure. Calls to instances picked locally are not reported.
 */
public class RotaOutcomeReporter implements LoadBalancerLifecycle<Object, Object, ServiceInstance> {
    private static final Log LOG = LogFactory.getLog(RotaOutcomeReporter.class);

    private final RotaClient client;

    public RotaOutcomeReporter(RotaClient client) {
        this.client = client;
    }

    @Override
    public void onStart(Request<Object> request) {
    }

    @Override
    public void onStartRequest(Request<Object> request, Response<ServiceInstance> lbResponse) {
        if (request.getContext() instanceof TimedRequestContext timed && timed.getRequestStartTime() == 0) {
            timed.setRequestStartTime(System.nanoTime());
        }
    }

    @Override
    public void onComplete(CompletionContext<Object, ServiceInstance, Object> completion) {
        CallOutcome outcome = outcome(completion, System.nanoTime());
        if (outcome == null) {
            return;
        }
        client.reportAsync(List.of(outcome)).whenComplete((result, error) -> {
            if (error != null && LOG.isDebugEnabled()) {
                LOG.debug("outcome of a call to " + outcome.instanceId() + " not reported: " + error);
            }
        });
    }

    /** The outcome to report for a completed call, or {@code null} when there is nothing to report. */
    static CallOutcome outcome(CompletionContext<Object, ServiceInstance, Object> completion, long nowNanos) {
        if (completion.status() == CompletionContext.Status.DISCARD || completion.getLoadBalancerResponse() == null) {
            return null;
        }
        ServiceInstance instance = completion.getLoadBalancerResponse().getServer();
        if (instance == null) {
            return null;
        }
        Map<String, String> metadata = instance.getMetadata();
        String ticket = metadata.get(RotaLoadBalancer.TICKET);
        if (ticket == null || metadata.containsKey(RotaLoadBalancer.LOCAL_FALLBACK)) {
            return null;
        }
        long latencyNanos = 0;
        Request<Object> request = completion.getLoadBalancerRequest();
        if (request != null && request.getContext() instanceof TimedRequestContext timed && timed.getRequestStartTime() != 0) {
            latencyNanos = Math.max(0, nowNanos - timed.getRequestStartTime());
        }
        return new CallOutcome(instance.getServiceId(), instance.getInstanceId(), Long.parseUnsignedLong(ticket),
                metadata.getOrDefault(RotaLoadBalancer.RULE, ""), Duration.ofNanos(latencyNanos), result(completion));
    }

    static CallResult result(CompletionContext<Object, ServiceInstance, Object> completion) {
        if (completion.status() == CompletionContext.Status.FAILED) {
            return completion.getThrowable() == null ? CallResult.ERROR : RotaClient.classify(completion.getThrowable());
        }
        HttpStatusCode status = httpStatus(completion.getClientResponse());
        return status != null && status.is5xxServerError() ? CallResult.ERROR : CallResult.OK;
    }

    private static HttpStatusCode httpStatus(Object response) {
        if (response instanceof ResponseData data) {
            return data.getHttpStatus();
        }
        if (response instanceof ClientHttpResponse http) {
            try {
                return http.getStatusCode();
            } catch (IOException e) {
                return null;
            }
        }
        return null;
    }
}
