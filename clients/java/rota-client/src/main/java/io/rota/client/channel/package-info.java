/**
 * rota inside standard gRPC channels: {@code Grpc.newChannelBuilder("rota:///orders", ...)}
 * resolves the service through rota's {@code Watch} and routes every RPC by leased tickets of
 * rota's shared rotation ({@link io.rota.client.channel.RotaChannels} for the options).
 */
package io.rota.client.channel;
