package io.rota.client;

import java.time.Duration;
import java.util.List;

import io.grpc.Status;
import io.rota.v1.PickResponse;

/**
 * Conversions between the client's model and the generated wire messages ({@code io.rota.v1}),
 * which stay inside the client.
 */
final class Wire {
    private Wire() {
    }

    static Instance instance(io.rota.v1.Instance message) {
        return new Instance(message.getService(), message.getId(), message.getHost(), message.getPort(),
                message.getVersion(), message.getZone(), message.hasWeight() ? message.getWeight() : Instance.DEFAULT_WEIGHT,
                message.getMetadataMap(), status(message.getStatus()));
    }

    static io.rota.v1.Instance instance(Instance instance) {
        return io.rota.v1.Instance.newBuilder()
                .setService(instance.service())
                .setId(instance.id())
                .setHost(instance.host())
                .setPort(instance.port())
                .setVersion(instance.version())
                .setZone(instance.zone())
                .setWeight(instance.weight())
                .putAllMetadata(instance.metadata())
                .setStatus(status(instance.status()))
                .build();
    }

    static List<io.rota.v1.Instance> instances(List<Instance> instances) {
        return instances.stream().map(Wire::instance).toList();
    }

    static InstanceStatus status(io.rota.v1.InstanceStatus status) {
        return switch (status) {
            case DRAINING -> InstanceStatus.DRAINING;
            case DOWN -> InstanceStatus.DOWN;
            // An instance announced without a status is UP.
            case UP, INSTANCE_STATUS_UNSPECIFIED, UNRECOGNIZED -> InstanceStatus.UP;
        };
    }

    static io.rota.v1.InstanceStatus status(InstanceStatus status) {
        return switch (status) {
            case UP -> io.rota.v1.InstanceStatus.UP;
            case DRAINING -> io.rota.v1.InstanceStatus.DRAINING;
            case DOWN -> io.rota.v1.InstanceStatus.DOWN;
        };
    }

    static InstanceRef ref(io.rota.v1.InstanceRef message) {
        return new InstanceRef(message.getService(), message.getId());
    }

    static io.rota.v1.InstanceRef ref(InstanceRef ref) {
        return io.rota.v1.InstanceRef.newBuilder().setService(ref.service()).setId(ref.id()).build();
    }

    static List<io.rota.v1.InstanceRef> refs(List<InstanceRef> refs) {
        return refs.stream().map(Wire::ref).toList();
    }

    static Ack ack(io.rota.v1.Ack message) {
        return new Ack(message.getLeaseId(), message.getSeq(),
                message.getAcceptedList().stream().map(Wire::ref).toList(),
                message.getRefusedList().stream()
                        .map(r -> new Refusal(ref(r.getInstance()), Status.fromCodeValue(r.getCode()).getCode(), r.getMessage()))
                        .toList(),
                Duration.ofMillis(message.getHeartbeatTimeoutMs()));
    }

    static io.rota.v1.Update update(Update update) {
        io.rota.v1.Update.Builder message = io.rota.v1.Update.newBuilder().setInstance(ref(update.instance()));
        update.status().ifPresent(s -> message.setStatus(status(s)));
        update.weight().ifPresent(message::setWeight);
        update.metadata().ifPresent(m -> message.setMetadata(io.rota.v1.Metadata.newBuilder().putAllEntries(m)));
        return message.build();
    }

    static Pick pick(PickResponse response) {
        return new Pick(instance(response.getInstance()), response.getTicket(), response.getRule(), response.getFallback(),
                response.getEpoch(), false);
    }

    static io.rota.v1.CallOutcome outcome(CallOutcome outcome) {
        return io.rota.v1.CallOutcome.newBuilder()
                .setService(outcome.service())
                .setInstanceId(outcome.instanceId())
                .setTicket(outcome.ticket())
                .setRule(outcome.rule())
                .setLatencyUs(outcome.latency().toNanos() / 1_000)
                .setResult(result(outcome.result()))
                .build();
    }

    static io.rota.v1.CallResult result(CallResult result) {
        return switch (result) {
            case OK -> io.rota.v1.CallResult.CALL_RESULT_OK;
            case CONNECT_FAILURE -> io.rota.v1.CallResult.CALL_RESULT_CONNECT_FAILURE;
            case ERROR -> io.rota.v1.CallResult.CALL_RESULT_ERROR;
        };
    }

    /** The event, or null for an event this client does not know. */
    static WatchEvent watchEvent(io.rota.v1.WatchEvent message) {
        long epoch = message.getEpoch();
        return switch (message.getEventCase()) {
            case SNAPSHOT -> new WatchEvent.Snapshot(epoch,
                    message.getSnapshot().getInstancesList().stream().map(Wire::instance).toList());
            case ADDED -> new WatchEvent.Added(epoch, instance(message.getAdded()));
            case UPDATED -> new WatchEvent.Updated(epoch, instance(message.getUpdated()));
            case REMOVED -> new WatchEvent.Removed(epoch, ref(message.getRemoved()));
            case EVENT_NOT_SET -> null;
        };
    }

    static InstanceList instanceList(io.rota.v1.ListInstancesResponse response) {
        return new InstanceList(response.getInstancesList().stream().map(Wire::instance).toList(), response.getEpoch());
    }

    static ServiceSummary service(io.rota.v1.ServiceSummary summary) {
        return new ServiceSummary(summary.getName(), summary.getInstances(), summary.getUp(), summary.getEpoch());
    }
}
