package io.rota.examples.consumer;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.client.loadbalancer.LoadBalanced;
import org.springframework.context.annotation.Bean;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.client.RestTemplate;

/**
 * A Spring Boot consumer: with {@code rota-spring-cloud} on the classpath, its
 * {@code @LoadBalanced RestTemplate} picks every instance of {@code hello-provider} through rota,
 * and an incoming {@code X-Rota-Version} header follows the call to the provider.
 */
@SpringBootApplication
public class ConsumerApplication {

    public static void main(String[] args) {
        SpringApplication.run(ConsumerApplication.class, args);
    }

    @Bean
    @LoadBalanced
    RestTemplate restTemplate() {
        return new RestTemplate();
    }

    @RestController
    static class HelloController {
        private final RestTemplate restTemplate;

        HelloController(RestTemplate restTemplate) {
            this.restTemplate = restTemplate;
        }

        @GetMapping("/hello")
        String hello() {
            return restTemplate.getForObject("http://hello-provider/", String.class);
        }
    }
}
