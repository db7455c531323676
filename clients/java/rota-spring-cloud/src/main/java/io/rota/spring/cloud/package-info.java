/**
 * Spring Cloud LoadBalancer backed by rota: with this module on the classpath every
 * load-balanced client picks through rota ({@link io.rota.spring.cloud.RotaLoadBalancer}), the
 * {@code X-Rota-Version} header follows each call chain, and the application can register itself
 * ({@code rota.registration.enabled=true}).
 */
package io.rota.spring.cloud;
