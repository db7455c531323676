package io.rota.client.testing;

import java.io.IOException;
import java.lang.reflect.Executable;
import java.lang.reflect.Field;
import java.lang.reflect.GenericArrayType;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;
import java.lang.reflect.TypeVariable;
import java.lang.reflect.WildcardType;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/** The public signatures of a package, to check which types they expose. */
public final class PublicApi {
    private PublicApi() {
    }

    /**
     * Every use of a type whose name starts with {@code forbiddenPrefix} in the public or protected
     * members of the public classes of {@code anchor}'s package (read from its classes folder), as
     * "Class.member: type".
     */
    public static List<String> uses(Class<?> anchor, String forbiddenPrefix) throws IOException, URISyntaxException {
        Path root = Path.of(anchor.getProtectionDomain().getCodeSource().getLocation().toURI());
        Path dir = root.resolve(anchor.getPackageName().replace('.', '/'));
        List<String> found = new ArrayList<>();
        try (Stream<Path> files = Files.list(dir)) {
            for (Path file : files.filter(f -> f.toString().endsWith(".class")).sorted().toList()) {
                String name = anchor.getPackageName() + "." + file.getFileName().toString().replaceFirst("\\.class$", "");
                Class<?> type;
                try {
                    type = Class.forName(name, false, anchor.getClassLoader());
                } catch (ClassNotFoundException e) {
                    throw new IOException(e);
                }
                if (visible(type)) {
                    check(type, forbiddenPrefix, found);
                }
            }
        }
        return found;
    }

    private static boolean visible(Class<?> type) {
        for (Class<?> t = type; t != null; t = t.getDeclaringClass()) {
            if (!Modifier.isPublic(t.getModifiers())) {
                return false;
            }
        }
        return !type.isSynthetic() && !type.isAnonymousClass();
    }

    private static void check(Class<?> type, String prefix, List<String> found) {
        String owner = type.getName();
        if (type.getGenericSuperclass() != null) {
            uses(type.getGenericSuperclass(), prefix, owner + " extends", found);
        }
        for (Type i : type.getGenericInterfaces()) {
            uses(i, prefix, owner + " implements", found);
        }
        for (Field field : type.getDeclaredFields()) {
            if (exposed(field.getModifiers())) {
                uses(field.getGenericType(), prefix, owner + "." + field.getName(), found);
            }
        }
        List<Executable> members = new ArrayList<>(List.of(type.getDeclaredConstructors()));
        members.addAll(List.of(type.getDeclaredMethods()));
        for (Executable member : members) {
            if (!exposed(member.getModifiers()) || member.isSynthetic()) {
                continue;
            }
            String where = owner + "." + member.getName();
            if (member instanceof Method method) {
                uses(method.getGenericReturnType(), prefix, where, found);
            }
            for (Type parameter : member.getGenericParameterTypes()) {
                uses(parameter, prefix, where, found);
            }
            for (Type thrown : member.getGenericExceptionTypes()) {
                uses(thrown, prefix, where, found);
            }
        }
    }

    private static boolean exposed(int modifiers) {
        return Modifier.isPublic(modifiers) || Modifier.isProtected(modifiers);
    }

    private static void uses(Type type, String prefix, String where, List<String> found) {
        if (type instanceof Class<?> c) {
            Class<?> element = c;
            while (element.isArray()) {
                element = element.getComponentType();
            }
            if (element.getName().startsWith(prefix)) {
                found.add(where + ": " + element.getName());
            }
        } else if (type instanceof ParameterizedType p) {
            uses(p.getRawType(), prefix, where, found);
            for (Type argument : p.getActualTypeArguments()) {
                uses(argument, prefix, where, found);
            }
        } else if (type instanceof GenericArrayType a) {
            uses(a.getGenericComponentType(), prefix, where, found);
        } else if (type instanceof WildcardType w) {
            for (Type bound : w.getUpperBounds()) {
                uses(bound, prefix, where, found);
            }
            for (Type bound : w.getLowerBounds()) {
                uses(bound, prefix, where, found);
            }
        } else if (type instanceof TypeVariable<?> v) {
            for (Type bound : v.getBounds()) {
                uses(bound, prefix, where, found);
            }
        }
    }
}
