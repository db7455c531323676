/**
 * Java client of rota, the central load-balancing decision service.
 *
 * <p>{@link io.rota.client.RotaClient} picks instances ({@link io.rota.client.Pick}), reports call
 * outcomes ({@link io.rota.client.CallOutcome}) and registers providers
 * ({@link io.rota.client.Registration} of {@link io.rota.client.Instance}s);
 * {@link io.rota.client.RotaVersion} carries the requested version along a call chain. What the
 * client takes and returns is this package's immutable model; the wire messages generated from
 * {@code rota/v1/rota.proto} ({@code io.rota.v1}) are used only inside it.
 */
package io.rota.client;
