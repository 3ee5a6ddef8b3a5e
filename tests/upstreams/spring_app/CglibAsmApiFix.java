/*
 * Works around a packaging fault in Debian 12's libspring-core-java 4.3.30-2: its spring-core jar
 * bundles CGLIB 3.3, whose AsmApi asks for ASM7 (Opcodes.ASM7 = 458752), beside Spring's own
 * repackaged ASM 6, whose ClassVisitor accepts only ASM4..ASM6. So the first CGLIB Enhancer, which
 * @EnableWebMvc's @Configuration classes need, fails with IllegalArgumentException in
 * ClassVisitor.<init> and the context cannot start. This class shadows
 * org.springframework.cglib.core.AsmApi (run.sh puts the app's classes before spring-core on the
 * class path) and asks for ASM6, the API the bundled ASM implements. Nothing about request
 * handling changes: CGLIB only builds the @Configuration proxies at start.
 */
package org.springframework.cglib.core;

import org.springframework.asm.Opcodes;

final class AsmApi {
    private AsmApi() {
    }

    static int value() {
        return Opcodes.ASM6;
    }
}
