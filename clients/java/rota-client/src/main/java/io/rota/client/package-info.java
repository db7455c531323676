/**
 * Java client of rota, the central load-balancing decision service.
 *
 * <p>{@link io.rota.client.RotaClient} picks instances ({@link io.rota.client.Pick}), reports call
 * outcomes and registers providers ({@link io.rota.client.Registration}); {@link io.rota.client.RotaVersion}
 * carries the requested version along a call chain. The wire types are in {@code io.rota.v1},
 * generated from {@code rota/v1/rota.proto}.
 */
package io.rota.client;
