package io.rota.client;

/**
 * What rota did with reported outcomes.
 *
 * @param accepted outcomes recorded
 * @param ignored  outcomes naming a service or instance that is not registered
 */
public record ReportResult(int accepted, int ignored) {
}
